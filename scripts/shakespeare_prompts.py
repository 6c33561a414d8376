"""`train_default_model.py prompts`: roseplay/workload/data/prompts.json from the training
split of the prepared texts (system prompts, short speech openings, long passages), token
counts by the bundled tokenizer."""
from __future__ import annotations

import json
import os
import random

import shakespeare_data as sd
from shakespeare_data import log


def _system_prompts(train: dict, ntok, args, rng) -> list[tuple[str, str, int]]:
    """A play's title + dramatis personae (+ first scene heading), within the token range."""
    systems = []
    for stem in sorted(train):
        dp = sd.dramatis_personae(train[stem])
        if not dp:
            continue
        lines = dp.rstrip("\n").split("\n")
        while lines and ntok("\n".join(lines) + "\n") > args.system_max_tokens:
            lines.pop()
        text = "\n".join(lines).rstrip() + "\n"
        n = ntok(text)
        if args.system_min_tokens <= n <= args.system_max_tokens:
            systems.append((stem, text, n))
    rng.shuffle(systems)
    return sorted(systems[: args.n_system])


def _short_prompts(train: dict, args, rng) -> list[str]:
    """SPEAKER.\\nfirst line of a speech (five words or more), each once."""
    cands = []
    for stem, text in sorted(train.items()):
        for _off, who, body in sd.speeches(text):
            first = body.split("\n")[0].strip()
            if len(first.split()) >= 5 and not first.startswith("["):
                cands.append(f"{who}.\n{first}\n")
    rng.shuffle(cands)
    return list(dict.fromkeys(cands))[: args.n_short]


def _long_passages(train: dict, ntok, args, rng) -> list[str]:
    """Contiguous passages from one speech boundary to another, within the token range."""
    passages: list[str] = []
    stems = sorted(k for k in train if sd.speeches(train[k]))
    for _ in range(10000):
        if len(passages) >= args.n_long:
            break
        text = train[rng.choice(stems)]
        sp = sd.speeches(text)
        i = rng.randrange(len(sp) - 1)
        target = rng.randint(args.long_min_tokens, args.long_max_tokens)
        j = i + 1
        while j < len(sp) and ntok(text[sp[i][0]:sp[j][0]]) < target:
            j += 1
        if j >= len(sp):
            continue
        passage = text[sp[i][0]:sp[j][0]].rstrip("\n") + "\n"
        if args.long_min_tokens <= ntok(passage) <= args.long_max_tokens \
                and passage not in passages:
            passages.append(passage)
    return passages


def cmd_prompts(args):
    from transformers import AutoTokenizer

    rng = random.Random(args.seed)
    with open(os.path.join(args.data, "works.json")) as f:
        works = json.load(f)
    tok = AutoTokenizer.from_pretrained(os.path.join(args.data, "tokenizer"))
    ntok = lambda s: len(tok(s).input_ids)  # noqa: E731
    train = {k: w["text"] for k, w in works.items() if w["split"] == "train"}
    systems = _system_prompts(train, ntok, args, rng)
    out = {"system_prompts": [t for _, t, _ in systems],
           "short": _short_prompts(train, args, rng),
           "long": _long_passages(train, ntok, args, rng)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for k, v in out.items():
        lens = [ntok(x) for x in v]
        log(f"{k}: {len(v)} prompts, tokens min {min(lens)} mean "
            f"{sum(lens) / len(lens):.0f} max {max(lens)}")
    log("system prompts from:", [s for s, _, _ in systems])

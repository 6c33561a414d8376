#!/usr/bin/env python3
"""Real acceptance on Shakespeare (docs/SPECULATIVE.md "Draft model"): the bundled model
without speculation, with n-gram drafts and with the bundled draft model, at batch 1
(one request at a time), greedy, each engine in its own process (EngineClient).

For each method: `--runs` runs over the same `--prompts` Shakespeare openings
(roseplay/workload/data/prompts.json "short"); per run the median TPOT of its requests, the
acceptance rate (accepted / drafted tokens), the mean accepted length (1 + accepted /
verified requests, vLLM's) and the acceptance rate per draft position (accepted at
position i / verified requests); printed as medians over the runs. Also checks that every
method produced the same tokens.

  PYTHONPATH=. python3 scripts/spec_acceptance.py            # CPU, k = 3, 5 runs
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import SamplingParams  # noqa: E402
from engine.front.client import EngineClient  # noqa: E402

METHODS = ("off", "ngram", "draft_model")


def run_method(method: str, args, prompts: list[str]) -> dict:
    spec = None if method == "off" else {"method": method, "num_speculative_tokens": args.k}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    client = EngineClient(label=f"accept-{method}", snapshots=False, model="default",
                          device=args.device, speculative_config=spec)
    try:
        client.submit(prompts[0], params).result(timeout=600)      # warm-up
        runs, tokens = [], None
        for _ in range(args.runs):
            before = client.engine_stats()
            outs = [client.submit(p, params).result(timeout=600) for p in prompts]
            assert client.wait_idle(600)
            runs.append(_run_stats(before, client.engine_stats(), outs))
            tokens = [list(o.outputs[0].token_ids) for o in outs]
    finally:
        client.close()
    return {"runs": runs, "tokens": tokens, **_medians(runs)}


def _run_stats(before, after, outs) -> dict:
    drafts = after.spec_decode_num_drafts - before.spec_decode_num_drafts
    drafted = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    pb = before.spec_decode_num_accepted_tokens_per_pos
    pa = after.spec_decode_num_accepted_tokens_per_pos
    per_pos = [a - (pb[i] if i < len(pb) else 0) for i, a in enumerate(pa)]
    return {"tpot_ms": 1000 * statistics.median(o.metrics.tpot for o in outs),
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_len": 1 + accepted / drafts if drafts else 1.0,
            "per_position": [a / drafts for a in per_pos] if drafts else []}


def _medians(runs: list[dict]) -> dict:
    n = max(len(r["per_position"]) for r in runs)
    return {"tpot_ms": statistics.median(r["tpot_ms"] for r in runs),
            "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
            "mean_accepted_len": statistics.median(r["mean_accepted_len"] for r in runs),
            "per_position": [statistics.median(r["per_position"][i] if i < len(r["per_position"])
                                               else 0.0 for r in runs) for i in range(n)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens (default 3)")
    ap.add_argument("--runs", type=int, default=5, help="runs per method (default 5)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per run (default 8)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens (default 64)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    with open(ROOT / "roseplay" / "data" / "prompts.json") as f:
        prompts = json.load(f)["short"][:args.prompts]
    results = {m: run_method(m, args, prompts) for m in METHODS}
    print(f"batch 1, k = {args.k}, {args.prompts} prompts x {args.max_tokens} tokens, "
          f"medians of {args.runs} runs ({args.device})")
    print(f"{'method':12s} {'TPOT ms':>8s} {'accept':>7s} {'mean len':>9s}  per position")
    for m, r in results.items():
        pos = " ".join(f"{p:.2f}" for p in r["per_position"])
        print(f"{m:12s} {r['tpot_ms']:8.2f} {r['acceptance_rate']:7.2f} "
              f"{r['mean_accepted_len']:9.2f}  {pos}")
    same = all(r["tokens"] == results["off"]["tokens"] for r in results.values())
    print("greedy tokens identical across methods:", same)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({m: {k: v for k, v in r.items() if k != "tokens"}
                       for m, r in results.items()}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

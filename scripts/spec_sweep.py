"""Speculative decoding's cost and gain as a function of acceptance, measured with the
benchmark-only oracle drafter (docs/SPECULATIVE.md): dummy weights make real drafts
meaningless, so a first non-speculative greedy run records the target's own outputs and
the oracle proposes them, each draft kept with probability p (else a wrong token).

PYTHONPATH=. python3 scripts/spec_sweep.py [--model dummy:qwen2.5-0.5b] [--batches 256,1]
    [--ks 1,2,3,4,5] [--ps 0,0.5,0.8,1.0] [--quick]

Per (batch, k, p), median of --repeat runs: output throughput (tok/s), TPOT p50 (ms),
acceptance rate and mean acceptance length; k = 0 is the non-speculative baseline.
Batch 256 is W1-like (512 random prompt tokens -> 128 output, EOS ignored, all at t=0).
Each (batch) loads the model once per k/p setting (the oracle's config is fixed at start).
"""
import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.getcwd())
from engine import LLM, SamplingParams  # noqa: E402


def prompts_for(batch: int, input_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab - 10, input_len).tolist() for _ in range(batch)]


def run(llm: LLM, prompts, params) -> dict:
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    c = llm.engine.counters
    return {"tok_s": tokens / wall, "tpot_ms": 1e3 * statistics.median(tpots),
            "drafts": c.spec_decode_num_drafts, "draft_tokens": c.spec_decode_num_draft_tokens,
            "accepted": c.spec_decode_num_accepted_tokens,
            "outputs": [list(o.outputs[0].token_ids) for o in outs]}


def measure(kw: dict, prompts, params, repeat: int) -> dict:
    with LLM(**kw) as llm:
        run(llm, prompts[:min(16, len(prompts))], params)       # warm-up
        results = [run(llm, prompts, params) for _ in range(repeat)]
    gc.collect()
    best = {k: statistics.median(r[k] for r in results) for k in ("tok_s", "tpot_ms")}
    last = results[-1]
    drafts = last["drafts"]          # the engine's counts: cumulative over its runs
    best["acceptance"] = last["accepted"] / last["draft_tokens"] if last["draft_tokens"] else 0.0
    best["mean_len"] = 1 + last["accepted"] / drafts if drafts else 1.0
    best["outputs"] = last["outputs"]
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--batches", default="256,1")
    ap.add_argument("--ks", default="1,2,3,4,5")
    ap.add_argument("--ps", default="0,0.5,0.8,1.0")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="k in {1,3,5}, repeat 2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ks = [1, 3, 5] if args.quick else [int(k) for k in args.ks.split(",")]
    repeat = 2 if args.quick else args.repeat
    ps = [float(p) for p in args.ps.split(",")]
    params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        base_kw = dict(model=args.model, max_num_seqs=max(batch, 1),
                       max_num_batched_tokens=8192)
        with LLM(**base_kw) as probe:
            vocab = probe.engine.vocab_size
        prompts = prompts_for(batch, args.input_len, vocab)
        base = measure(base_kw, prompts, params, repeat)
        print(f"batch {batch:4d} k 0        tok/s {base['tok_s']:10.0f}  TPOT p50 "
              f"{base['tpot_ms']:7.2f} ms", flush=True)
        rows.append({"batch": batch, "k": 0, "p": None, **{k: base[k] for k in ("tok_s", "tpot_ms")}})
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([[p, o] for p, o in zip(prompts, base["outputs"])], f)
            refs = f.name
        try:
            for k in ks:
                for p in ps:
                    spec = {"method": "oracle", "num_speculative_tokens": k,
                            "oracle_acceptance": p, "oracle_references": refs}
                    r = measure({**base_kw, "speculative_config": spec}, prompts, params, repeat)
                    same = r["outputs"] == base["outputs"]
                    print(f"batch {batch:4d} k {k} p {p:.1f}  tok/s {r['tok_s']:10.0f}  TPOT p50 "
                          f"{r['tpot_ms']:7.2f} ms  acceptance {r['acceptance']:.2f}  mean len "
                          f"{r['mean_len']:.2f}  speedup x{r['tok_s'] / base['tok_s']:.2f}"
                          f"{'' if same else '  (outputs differ from k=0)'}", flush=True)
                    rows.append({"batch": batch, "k": k, "p": p, "same_output": same,
                                 **{x: r[x] for x in ("tok_s", "tpot_ms", "acceptance",
                                                      "mean_len")}})
        finally:
            os.unlink(refs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Speculative decoding's cost and gain as a function of acceptance, measured with the
oracle drafter (benchmarks/oracle.py, handed to LLM as its proposer; docs/SPECULATIVE.md):
dummy weights make real drafts
meaningless, so the oracle proposes the target's own greedy outputs, each draft kept
with probability p (else a wrong token).

The references come from the verify step's own numerics: for each k the p = 0 run (run
first; every draft wrong) emits each token from a verify step's first row, whose inputs
are all correct, so its outputs are the greedy trajectory that verify rows compute;
proposed back at any p they are accepted with probability p. References from the k = 0
run would not be: in bf16 a decode row and a verify row of another batch shape round
differently, a near-tie flips and the run drifts (an acceptance of 0.04 at p = 1 on the
H100 before 2026-11-28). The p = 0 run itself proposes the k = 0 run's tokens, wrong.

PYTHONPATH=. python3 scripts/spec_sweep.py [--model dummy:qwen2.5-0.5b] [--batches 256,1]
    [--ks 1,2,3,4,5] [--ps 0,0.5,0.8,1.0] [--repeat 5] [--dtype float32] [--quick]
    [--json out.json]

One engine per batch size (k is the live knob, p and the references are set on the
oracle between runs), so the model loads and graphs capture once. Per
(batch, k, p): median of --repeat runs of output throughput (tok/s), of the runs' TPOT
p50 (ms) and of their mean step time and its host part (the step minus the time the
host waited for the device: planning, batch building, launches, commit; "x R of k =
0's": the step against the baseline's, at batch 1 a verify step against a decode step),
acceptance and mean acceptance length over those runs; k = 0 is the baseline. Each
(k, p) alternates its runs with runs at k = 0 ("k = 0 beside"), and its ratios are to
those: a sweep takes minutes and the host's speed drifts over them (docs/PERF.md, the
H200 table of 2026-11-29 11:44 UTC: batch 256 at p > 0 read x0.81-0.89 against the k = 0
row measured minutes before, with speculation off in every step measured). Batch 256 is
W1-like (512 random prompt tokens -> 128 output, EOS ignored, all at t = 0); batch 1
the same request alone. Each oracle draft is right with probability p, so accepted /
drafted is (p + p^2 + ... + p^k) / k (printed as "expected"; 1 at p = 1), and a checked
draft (one whose predecessors were all accepted) is accepted with probability p
("per checked draft", pooled then by position). Outputs must
equal the k's references; "differ from k = 0" marks bf16 rounding (float32: never).
Every run generates the same prompts, so after the first their prefixes come from the
prefix cache: a warm-up run of all of them comes first, so every measured run prefills
alike (before 2026-11-29 the warm-up had 16 prompts and the first measured run of k = 0
prefilled all of its prompts: the one slow run of five at batch 256). Each line ends
with its runs' tok/s in order, and a run's garbage-collection pauses where they took a
millisecond or more.

Speculation's off-switch (speculative_config disable_by_batch_size, the engine's
default unless --disable-by-batch-size says otherwise; "none": never off) applies: with
more requests decoding than it, steps draft nothing and run as plain decode steps (the
row says "off in N% of steps"), so batch 256 shows the plain decode speed at any k.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks.oracle import OracleProposer  # noqa: E402
from gc_pauses import gc_pauses  # noqa: E402
from profile_step import add_set_argument, apply_settings  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402


def run(llm: LLM, prompts, params) -> dict:
    c = llm.engine.counters
    d0, t0, a0 = (c.spec_decode_num_drafts, c.spec_decode_num_draft_tokens,
                  c.spec_decode_num_accepted_tokens)
    steps0, wait0, off0 = c.steps, c.device_wait_us, c.spec_decode_steps_off
    pos0 = list(llm.engine.spec.accepted_per_pos)
    start = time.perf_counter()
    with gc_pauses() as pauses:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    wall = time.perf_counter() - start
    steps = max(1, c.steps - steps0)
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    return {"tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall,
            "tpot_ms": 1e3 * statistics.median(tpots),
            "step_ms": 1e3 * wall / steps,
            "host_ms": (1e3 * wall - 1e-3 * (c.device_wait_us - wait0)) / steps,
            "drafts": c.spec_decode_num_drafts - d0,
            "draft_tokens": c.spec_decode_num_draft_tokens - t0,
            "accepted": c.spec_decode_num_accepted_tokens - a0,
            "off": (c.spec_decode_steps_off - off0) / steps,
            "per_pos": [a - b for a, b in zip(llm.engine.spec.accepted_per_pos, pos0)],
            "gc_ms": 1e3 * sum(t for _, t in pauses),
            "outputs": [list(o.outputs[0].token_ids) for o in outs]}


# measure()'s figures that every --json row carries (k = 0's too)
RUN_FIELDS = ("tok_s", "tpot_ms", "step_ms", "host_ms", "tok_s_range", "tpot_ms_range",
              "tok_s_runs", "gc_ms_runs")


def _rng(r: dict, key: str, digits: int) -> str:
    lo, hi = r[key + "_range"]
    return f"({lo:,.{digits}f}..{hi:,.{digits}f})"


def _runs(r: dict) -> str:
    """Each run's tok/s in the order they ran, with its garbage collections' pauses where
    they took a millisecond or more."""
    return " / ".join(f"{x:,.0f}" + (f" (gc {g:.0f} ms)" if g >= 1 else "")
                      for x, g in zip(r["tok_s_runs"], r["gc_ms_runs"]))


def expected_acceptance(p: float, k: int) -> float:
    """Accepted / drafted when each of k drafts is right with probability p: draft i is
    accepted when drafts 1..i all are (drafts cut short near the length cap aside)."""
    return sum(p ** i for i in range(1, k + 1)) / k


def per_draft(drafts: int, per_pos: list[int], k: int) -> tuple[float, list[float]]:
    """The acceptance of a draft token that was checked (its predecessors all accepted),
    pooled and by position: the oracle's p, where (p + ... + p^k) / k is accepted /
    drafted. Draft j is checked in every verify that accepted draft j - 1 (each verify
    checks its first): exact for drafts of k tokens; one cut short near the length cap
    counts as checked past its end, which biases these low by a hair."""
    checked = [drafts] + per_pos[:k - 1]
    pooled = sum(per_pos[:k]) / sum(checked) if drafts else 0.0
    return pooled, [a / n if n else 0.0 for a, n in zip(per_pos[:k], checked)]


def summarize(runs: list[dict], k: int) -> dict:
    """The median figures of runs at one k, their ranges and the acceptance pooled."""
    drafts, tokens, accepted = (sum(r[x] for r in runs)
                                for x in ("drafts", "draft_tokens", "accepted"))
    return {**{x: statistics.median(r[x] for r in runs)
               for x in ("tok_s", "tpot_ms", "step_ms", "host_ms")},
            **{x + "_range": (min(r[x] for r in runs), max(r[x] for r in runs))
               for x in ("tok_s", "tpot_ms")},
            "acceptance": accepted / tokens if tokens else 0.0,
            "per_draft": per_draft(drafts, [sum(col) for col in zip(*(r["per_pos"]
                                                                     for r in runs))], k),
            "off": statistics.median(r["off"] for r in runs),
            "mean_len": 1 + accepted / drafts if drafts else 1.0,
            "tok_s_runs": [r["tok_s"] for r in runs],        # in order: a slow first run shows
            "gc_ms_runs": [r["gc_ms"] for r in runs],
            "same": all(r["outputs"] == runs[0]["outputs"] for r in runs),
            "outputs": runs[-1]["outputs"]}


def measure(llm: LLM, prompts, params, repeat: int, k: int,
            beside: bool = False) -> tuple[dict, dict | None]:
    """`repeat` runs at k after a warm-up (new shapes, the prompts into the cache); with
    `beside`, each followed by a run at k = 0, so that a drift of the host over the
    minutes of a sweep falls on both alike. Returns (k's figures, k = 0's beside them)."""
    eng = llm.engine
    sides = [k, 0] if beside else [k]
    runs: dict[int, list] = {x: [] for x in sides}
    for i in range(repeat + 1):
        for x in sides:
            eng.set_knobs(eng.knobs.replace(num_speculative_tokens=x))
            r = run(llm, prompts, params)
            if i:
                runs[x].append(r)
    return summarize(runs[k], k), summarize(runs[0], 0) if beside else None


def sweep(args, batch: int, ks, ps, repeat: int, rows: list) -> None:
    params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    oracle = OracleProposer()
    spec = {"method": "ngram"}
    if args.disable_by_batch_size != "default":
        spec["disable_by_batch_size"] = None if args.disable_by_batch_size == "none" \
            else int(args.disable_by_batch_size)
    # started at the largest k: the verify graphs are captured for it
    with LLM(model=args.model, max_num_seqs=max(batch, 16), max_num_batched_tokens=8192,
             num_speculative_tokens=max(ks), proposer=oracle, dtype=args.dtype,
             speculative_config=spec) as llm:
        rng = np.random.default_rng(0)
        vocab = llm.engine.vocab_size
        prompts = [rng.integers(10, vocab - 10, args.input_len).tolist() for _ in range(batch)]
        base, _ = measure(llm, prompts, params, repeat, 0)
        print(f"batch {batch:4d} k 0        tok/s {base['tok_s']:10.0f} {_rng(base, 'tok_s', 0)}  "
              f"TPOT p50 {base['tpot_ms']:7.2f} ms {_rng(base, 'tpot_ms', 2)}  step "
              f"{base['step_ms']:6.2f} ms (host {base['host_ms']:5.2f})  runs "
              f"{_runs(base)}", flush=True)
        rows.append({"batch": batch, "k": 0, "p": None, "dtype": args.dtype,
                     **{x: base[x] for x in RUN_FIELDS}})
        for k in ks:
            # p = 0 first, proposing the k = 0 outputs: its outputs are the references
            oracle.set_references(zip(prompts, base["outputs"]))
            oracle.p = 0.0
            at_0 = measure(llm, prompts, params, repeat if 0.0 in ps else 1, k, 0.0 in ps)
            refs = at_0[0]["outputs"]
            oracle.set_references(zip(prompts, refs))
            for p in ps:
                oracle.p = p
                r, k0 = at_0 if p == 0.0 else measure(llm, prompts, params, repeat, k, True)
                same = r["same"] and r["outputs"] == refs
                drift = refs != base["outputs"]
                off = f"  off in {100 * r['off']:.0f}% of steps" if r["off"] else ""
                print(f"batch {batch:4d} k {k} p {p:.1f}  tok/s {r['tok_s']:10.0f} "
                      f"{_rng(r, 'tok_s', 0)}  TPOT p50 {r['tpot_ms']:7.2f} ms "
                      f"{_rng(r, 'tpot_ms', 2)}  step {r['step_ms']:6.2f} ms (host "
                      f"{r['host_ms']:5.2f}, x{r['step_ms'] / k0['step_ms']:.2f} of k = 0's)"
                      f"  acceptance {r['acceptance']:.2f} (expected "
                      f"{expected_acceptance(p, k):.2f}; per checked draft "
                      f"{r['per_draft'][0]:.2f}: "
                      f"{' '.join(f'{x:.2f}' for x in r['per_draft'][1])})  "
                      f"mean len {r['mean_len']:.2f}  throughput "
                      f"x{r['tok_s'] / k0['tok_s']:.2f}  TPOT "
                      f"x{r['tpot_ms'] / k0['tpot_ms']:.2f}"
                      f"{off}  k = 0 beside: {k0['tok_s']:.0f} tok/s {_rng(k0, 'tok_s', 0)}, "
                      f"TPOT {k0['tpot_ms']:.2f} ms, step {k0['step_ms']:.2f} ms"
                      f"{'' if same else '  (outputs differ from the references)'}"
                      f"{'  (references differ from k = 0)' if drift else ''}  runs {_runs(r)}",
                      flush=True)
                rows.append({"batch": batch, "k": k, "p": p, "dtype": args.dtype,
                             "same_output": same, "references_differ_from_k0": drift,
                             "off_steps": r["off"],
                             "step_vs_k0": r["step_ms"] / k0["step_ms"],
                             "k0_beside": {x: k0[x] for x in RUN_FIELDS},
                             "expected_acceptance": expected_acceptance(p, k),
                             **{x: r[x] for x in RUN_FIELDS + ("acceptance", "mean_len")},
                             "per_checked_draft": r["per_draft"][0],
                             "per_checked_draft_by_position": r["per_draft"][1]})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--batches", default="256,1")
    ap.add_argument("--ks", default="1,2,3,4,5",
                    help="draft lengths, each >= 1 (k = 0, the baseline, runs at every batch)")
    ap.add_argument("--ps", default="0,0.5,0.8,1.0")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="float32: the oracle's acceptance is its p (no bf16 near-tie drift)")
    ap.add_argument("--disable-by-batch-size", default="default", metavar="N|none|default",
                    help="speculative_config disable_by_batch_size: default (the engine's), "
                         "none (never off: verify steps at every batch), or N")
    ap.add_argument("--quick", action="store_true", help="k in {1, 3, 5}, repeat 3")
    ap.add_argument("--json", default=None)
    add_set_argument(ap)
    args = ap.parse_args()
    apply_settings(args.set)
    ks = [1, 3, 5] if args.quick else [int(k) for k in args.ks.split(",")]
    if min(ks) < 1:
        ap.error("--ks: draft lengths of 1 or more (k = 0 runs at every batch as the baseline)")
    repeat = 3 if args.quick else args.repeat
    ps = [float(p) for p in args.ps.split(",")]
    rows: list = []
    for batch in (int(b) for b in args.batches.split(",")):
        sweep(args, batch, ks, ps, repeat, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

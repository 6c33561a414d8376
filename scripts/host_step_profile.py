"""The engine's host work per step, without the model: the real scheduler, KV manager,
batch builder, commit, token emission and stats, with the forward replaced by a stub
that returns token 7 for every sample row. What is left is the Python a GPU step must
hide behind the device; it runs on any machine.

    python scripts/host_step_profile.py                      # closed loop, 256 in flight
    python scripts/host_step_profile.py --profile 25         # + cProfile's top 25
    python scripts/host_step_profile.py --output-len 100000  # pure decode (W1's decode phase)
    python scripts/host_step_profile.py --runner             # + the runner's host work
    python scripts/host_step_profile.py --speculative 3 --oracle-p 1   # verify steps
    python scripts/host_step_profile.py --kv-events          # + KV events published
    python scripts/host_step_profile.py --runner --logprobs-every 8   # the TUI's logprobs rows
    python scripts/host_step_profile.py --front              # + the front's output processing
    python scripts/host_step_profile.py --device-ms 0.75     # + an emulated device's time
    python scripts/host_step_profile.py --burst 3 --front    # W1's shape: finishing steps
    python scripts/host_step_profile.py --burst 6 --stop-rows 2   # + stop-token finishes
    python scripts/host_step_profile.py --runner --speculative 3 --oracle-p 0.8 \
        --concurrency 1 --warmup-steps 300 --steps 3000 --critical-path  # a verify's path

--speculative K verifies K oracle drafts per request and step (docs/SPECULATIVE.md "Host
cost"): the stub's outputs are all token 7, so the oracle's references are 7s and
--oracle-p sets the acceptance exactly (p = 1: every draft accepted, p = 0: none).
Speculation's off-switch is disabled (disable_by_batch_size null) so that every step
verifies at any --concurrency: the figure is a verify step's host work.

--runner keeps the real ModelRunner (StepBuffers.fill, the sampler, HostCopy) and stubs
only the model's forward: logits of the right shape with token 7 on top.

--front runs the front's OutputProcessor.process (engine/front/processor.py) on each
step's output, as LLM.generate does on the engine's own thread in process (W1's bench):
token ids into each request's state, and its final RequestOutput (text decoded once) as
it finishes.

--kv-events turns kv_events_config on and attaches the engine process's publisher
(engine/ipc/kv_publisher.py: its thread encodes and sends beside the step, on loopback
tcp with no subscriber), so the figure is the step's cost of events (docs/ROUTING.md
"Cost").

--device-ms D emulates a device: each step's forward takes D ms on a device that runs
one step at a time (it starts when launched or when the step before it ends), and
reading a step's tokens waits for its end. The wall time per step is then what a GPU
step of D ms would take: D plus the host work that is not hidden behind the device (a
synchronous verify step's planning, commit and outputs; docs/SPECULATIVE.md "Host
cost"), where the figure without it is all of the host's work.

Closed loop as observer_cost.py runs it: --concurrency requests in flight, each
--input-len random prompt tokens -> --output-len tokens, a new one as one finishes.
Prints host ms per step, steps/s and output tok/s that a zero-time device would allow,
the best block: ms per step of the fastest BLOCK consecutive steps, the figure that
other processes on a shared, loaded box disturb least, and the median step (with
--device-ms the best block may hold a few calls that only launch a chained step, so the
median is the steadier figure of a verify step there).

    python scripts/host_step_profile.py --trees /tmp/host_base . --runs 5 [options]

runs the same measurement on each checkout (its own engine, this script), interleaved,
and prints each tree's median (min..max) and the per-round ratios of each tree to the
first: the box's load drifts, so the ratios are the steadier figure.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import statistics
import sys
import time

BLOCK = 10          # steps per timed block (the best block: see the docstring)
SCRIPTS = os.path.dirname(os.path.abspath(__file__))
# the engine measured: this checkout's, or (--trees) the one each run is started for
sys.path.insert(0, os.environ.get("HOST_STEP_TREE") or os.path.dirname(SCRIPTS))
sys.path.insert(0, SCRIPTS)

from ab_runs import interleaved, run_in_tree, spread  # noqa: E402
from gc_pauses import gc_pauses  # noqa: E402
from host_loop import ROUND_START, ClosedLoop, make_engine, warm_loop  # noqa: E402


def run(args) -> dict:
    engine, loop, publisher = warm_loop(args)
    prof = cProfile.Profile() if args.profile else None
    tokens, t0, c0 = 0, time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    blocks = []        # each BLOCK steps' time: the best block is the load's least
    steps = []         # each step's: their median, what a load's spikes move least
    with gc_pauses() as pauses:
        for i in range(args.steps):
            ts = time.perf_counter()
            if i % BLOCK == 0:
                tb = ts
            tokens += loop.step()
            steps.append(time.perf_counter() - ts)
            if i % BLOCK == BLOCK - 1:
                blocks.append(time.perf_counter() - tb)
    if prof:
        prof.disable()
    print("garbage collections a 1000 steps (young, middle, full): "
          + ", ".join(f"{1000 * sum(g == gen for g, _ in pauses) / args.steps:.1f}"
                      for gen in range(3))
          + f"; their pauses {1e3 * sum(t for _, t in pauses) / args.steps:.3f} ms a step")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if publisher is not None:
        publisher.close()
    if engine.stats.last_error:     # a failing (stubbed) forward errors requests quietly
        raise SystemExit(f"the engine failed a step: {engine.stats.last_error}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return {"ms_per_step": 1e3 * wall / args.steps, "cpu_ms_per_step": 1e3 * cpu / args.steps,
            "best_ms_per_step": 1e3 * min(blocks) / BLOCK if blocks else float("nan"),
            "median_step_ms": 1e3 * statistics.median(steps),
            "steps_per_s": args.steps / wall,
            "tok_per_s": tokens / wall, "tok_per_step": tokens / args.steps}


def burst(args) -> None:
    """--burst R: W1's shape instead of the closed loop: --concurrency requests at once,
    run to the end, R times (the first a warm-up), the prefix cache cleared before each
    (as the bench does before a run). Prints the median host ms of the start (the
    submissions and the first step, to its launch), of the mixed steps (a request
    waiting or prefilling before the step), of the steps in which requests finished and
    of the plain decode steps (none of those), each kind's total a round, the same of
    the thread's CPU time (with --device-ms it counts the spin that waits for the
    emulated device), and the garbage collections a round ran, by generation."""
    engine, _, _ = make_engine(args)
    # the closed loop's requests (distinct prompts, its front), submitted by hand
    loop = ClosedLoop(engine, None, 0, args.input_len, args.output_len, front=args.front)
    sched = engine.scheduler
    kinds = {"start": [], "mixed": [], "finishing": [], "decode": []}
    cpu = {kind: [] for kind in kinds}   # each step's thread CPU time (no --device-ms)

    def one_round(timed: bool) -> None:
        ROUND_START[0] = engine.executor.runner.forward_calls
        engine.clear_prefix_cache()
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(args.concurrency):
            loop.submit()
        first = True
        while engine.has_unfinished():
            prefill = bool(sched.waiting) or any(q.num_uncomputed > 1 for q in sched.running)
            if not first:       # (the start's clocks run from its first submission)
                t, c = time.perf_counter(), time.thread_time()
            out = engine.step()
            if loop.front is not None:
                loop.front.process(out)
            took = time.perf_counter() - t
            if timed:
                kind = "start" if first else "finishing" if out.finished \
                    else "mixed" if prefill else "decode"
                kinds[kind].append(took)
                cpu[kind].append(time.thread_time() - c)
            first = False
    one_round(False)            # the warm-up
    prof = cProfile.Profile() if args.profile else None
    with gc_pauses() as pauses:
        if prof:
            prof.enable()
        for _ in range(args.burst - 1):
            one_round(True)
        if prof:
            prof.disable()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    rounds = max(args.burst - 1, 1)
    for kind, took in kinds.items():
        name = kind if kind == "start" else f"{kind} steps"
        print(f"{name}: {len(took)}, median host {1e3 * statistics.median(took):.3f} ms "
              f"({1e3 * min(took):.3f}..{1e3 * max(took):.3f}), "
              f"{1e3 * sum(took) / rounds:.2f} ms a round, cpu "
              f"{1e3 * statistics.median(cpu[kind]):.3f} ms median, "
              f"{1e3 * sum(cpu[kind]) / rounds:.2f} ms a round")
    print("garbage collections a round (young, middle, full): "
          + ", ".join(f"{sum(g == gen for g, _ in pauses) / rounds:.1f}" for gen in range(3)))


def measure_tree(tree: str, args) -> dict:
    """One run of this measurement on `tree`'s engine (a fresh process)."""
    argv = ["--model", args.model, "--concurrency", str(args.concurrency),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens),
            "--num-blocks", str(args.num_blocks), "--warmup-steps", str(args.warmup_steps),
            "--steps", str(args.steps), "--speculative", str(args.speculative),
            "--oracle-p", str(args.oracle_p), "--device-ms", str(args.device_ms),
            "--logprobs-every", str(args.logprobs_every)] + (["--runner"] if args.runner else []) \
        + (["--kv-events"] if args.kv_events else []) + (["--front"] if args.front else [])
    out = run_in_tree(tree, [os.path.abspath(__file__), *argv],
                      HOST_STEP_TREE=os.path.abspath(tree))
    found = re.search(r"^host ([\d.]+) ms/step.*\(cpu ([\d.]+) ms/step, best block ([\d.]+) "
                      r"ms/step, median step ([\d.]+) ms\)", out, re.M)
    if not found:
        raise SystemExit(f"{tree}: no result\n{out[-3000:]}")
    return {"ms": float(found.group(1)), "cpu_ms": float(found.group(2)),
            "best": float(found.group(3)), "median": float(found.group(4))}


def compare_trees(args) -> int:
    print(f"load average at start: {os.getloadavg()}", flush=True)
    res = interleaved(args.trees, args.runs, lambda tree: measure_tree(tree, args))
    # cpu, the best block and the median step: steadier than the mean on a shared box
    for key, what in (("ms", "host"), ("cpu_ms", "cpu"), ("best", "best block"),
                      ("median", "median step")):
        first = res[args.trees[0]][key]
        for tree, r in res.items():
            ratios = [b / a for a, b in zip(first, r[key])]
            print(f"{tree}: {what} {spread(r[key], '.3f')} ms/step; per-round ratio to "
                  f"{args.trees[0]}: {spread(ratios, '.3f')}; runs {r[key]}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-blocks", type=int, default=40_000,
                   help="KV pool size: the closed loop fills this one with cached blocks "
                        "within the warm-up, so every allocation then evicts, as on a GPU's "
                        "340k-block pool after ~20 s of serving")
    p.add_argument("--warmup-steps", type=int, default=600)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N")
    p.add_argument("--runner", action="store_true",
                   help="keep the real runner (buffers, sampler, host copy); stub only the "
                        "model's forward")
    p.add_argument("--speculative", type=int, default=0, metavar="K",
                   help="oracle drafts per request and step (0: no speculation)")
    p.add_argument("--oracle-p", type=float, default=1.0,
                   help="--speculative: the oracle's acceptance (1: all accepted, 0: none)")
    p.add_argument("--device-ms", type=float, default=0.0, metavar="D",
                   help="emulate a device: each step's forward takes D ms (0: none)")
    p.add_argument("--kv-events", action="store_true",
                   help="KV events on, published by the engine process's publisher")
    p.add_argument("--front", action="store_true",
                   help="+ the front's output processing of each step (LLM.generate's)")
    p.add_argument("--logprobs-every", type=int, default=0, metavar="N",
                   help="1 request in N asks its top 5 logprobs, as the TUI's workload does "
                        "(with --runner the sampler takes them; a small vocabulary, "
                        "dummy:tiny's, keeps the CPU's log-softmax out of the figure)")
    p.add_argument("--stop-rows", type=int, default=0, metavar="K",
                   help="--burst: from the 30th forward of a round on, K rows a step sample "
                        "the stop token of every request (a workload ending by stop tokens)")
    p.add_argument("--burst", type=int, default=0, metavar="R",
                   help="W1's shape: --concurrency requests at once, to the end, R rounds "
                        "(the first a warm-up); host ms of mixed, finishing and decode steps")
    p.add_argument("--critical-path", action="store_true",
                   help="with --speculative and --runner: a verify step's host time from "
                        "its tokens' arrival to the next forward, by part "
                        "(scripts/critical_path.py)")
    p.add_argument("--trees", nargs="+", metavar="DIR",
                   help="checkouts to compare (interleaved runs of this measurement)")
    p.add_argument("--runs", type=int, default=5, help="rounds over --trees")
    args = p.parse_args(argv)
    if args.trees:
        return compare_trees(args)
    if args.burst:
        burst(args)
        return 0
    if args.critical_path:
        from critical_path import measure
        measure(args)
        return 0
    runs = [run(args) for _ in range(args.repeat)]
    ms = sorted(r["ms_per_step"] for r in runs)
    for r in runs:
        print(f"host {r['ms_per_step']:.3f} ms/step  {r['steps_per_s']:.0f} steps/s  "
              f"{r['tok_per_step']:.1f} tok/step  {r['tok_per_s']:,.0f} tok/s  "
              f"(cpu {r['cpu_ms_per_step']:.3f} ms/step, best block "
              f"{r['best_ms_per_step']:.3f} ms/step, median step {r['median_step_ms']:.3f} ms)")
    if len(runs) > 1:
        print(f"median {ms[len(ms) // 2]:.3f} ms/step ({ms[0]:.3f}..{ms[-1]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

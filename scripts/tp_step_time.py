"""Batch-1 decode under tensor parallelism: where does a step's time go?

    python scripts/tp_step_time.py --model dummy:llama-3.1-8b --tp 2 --repeat 3
    python scripts/tp_step_time.py --model dummy:tiny --device cpu --tp 2 --steps 32  # dry run

One request (greedy, `--input-len` prompt tokens) decodes `--steps` tokens, `--repeat`
times on one engine. Per decode step (engine.step() in steady state, async scheduling as
configured): the wall time (= TPOT), the time rank 0 waits for the device (the step's
one host sync: the engine's counters.device_wait_us), the host's own time (wall - wait:
scheduling, batch build, the broadcast to the workers, launches) and, under TP, the
broadcast alone.
With --noop-all-reduce (or ROSEPLAY_TP_NOOP_ALL_REDUCE=1) every all-reduce is dropped
(tokens wrong): the difference in step time to a normal run is the all-reduces' share of
the step. The hook lives here, not in the engine: the ranks are spawned with this file's
_rank_main as their entry, which drops their all-reduces before it runs the engine's.
Prints one `key=value` line per run and a `summary` line (medians over the runs).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from devtools.tp_timeout import exit_with_stacks_after  # noqa: E402

NOOP_ENV = "ROSEPLAY_TP_NOOP_ALL_REDUCE"


def _no_all_reduce(tensor, *args, **kwargs) -> None:
    return None


def drop_all_reduces() -> None:
    """Every torch.distributed.all_reduce of this process, and of the TP ranks it spawns
    from now on, a no-op: measurement only, the tokens are wrong."""
    import tp_step_time        # this file by its module name, which a spawned rank imports
    from engine.worker.distributed import worker
    dist.all_reduce = _no_all_reduce
    worker.worker_main = tp_step_time._rank_main


def _rank_main(*args) -> None:
    """A spawned rank's entry under --noop-all-reduce: the engine's, all-reduces dropped."""
    from engine.worker.distributed.worker import worker_main
    dist.all_reduce = _no_all_reduce
    worker_main(*args)


class Timed:
    """Accumulates the seconds spent in one method (patched on its class or instance)."""

    def __init__(self, owner, name: str):
        self.total, inner = 0.0, getattr(owner, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.total += time.perf_counter() - t0
        setattr(owner, name, timed)


def one_run(llm, args, rng, bcast: Timed | None) -> dict:
    eng = llm.engine
    prompt = rng.integers(0, eng.vocab_size, args.input_len).tolist()
    req = llm.add_request({"prompt_token_ids": prompt},
                          SamplingParams(max_tokens=args.steps + 8, temperature=0.0,
                                         ignore_eos=True))
    while len(req.output_token_ids) < 4:         # prefill, then a few steps to reach steady state
        eng.step()
    walls, waits, bcasts = [], [], []
    for _ in range(args.steps):
        w0, b0 = eng.counters.device_wait_us, bcast.total if bcast else 0.0
        t0 = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t0)
        waits.append((eng.counters.device_wait_us - w0) / 1e6)
        bcasts.append((bcast.total if bcast else 0.0) - b0)
    while eng.has_unfinished():
        eng.step()
    ms = lambda xs: 1e3 * statistics.median(xs)     # noqa: E731
    return {"step_ms": ms(walls), "wait_ms": ms(waits),
            "host_ms": ms([w - x for w, x in zip(walls, waits)]), "bcast_ms": ms(bcasts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="dummy:llama-3.1-8b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-async", action="store_true", help="async_scheduling off")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--noop-all-reduce", action="store_true",
                   help=f"drop every all-reduce (tokens wrong; also ${NOOP_ENV}=1)")
    args = p.parse_args()
    noop = args.noop_all_reduce or os.environ.get(NOOP_ENV) == "1"
    if noop:
        drop_all_reduces()
    cancel = exit_with_stacks_after(args.timeout_s)
    llm = LLM(model=args.model, device=args.device, dtype=args.dtype,
              tensor_parallel_size=args.tp, async_scheduling=not args.no_async,
              max_model_len=args.input_len + args.steps + 64)
    try:
        group = llm.engine.executor.group
        bcast = Timed(group, "broadcast") if group is not None else None
        rng = np.random.default_rng(0)
        one_run(llm, args, rng, bcast)   # warm-up run
        runs = [one_run(llm, args, rng, bcast) for _ in range(args.repeat)]
    finally:
        llm.engine.close()
    tag = f"tp={args.tp} batch=1 async={int(not args.no_async)} noop_all_reduce={int(noop)}"
    for i, r in enumerate(runs):
        print(f"run {i + 1}/{args.repeat} {tag} " + " ".join(f"{k}={v:.3f}" for k, v in r.items()))
    steps = [r["step_ms"] for r in runs]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"summary {tag} step_ms={med['step_ms']:.3f} min={min(steps):.3f} max={max(steps):.3f} "
          f"host_ms={med['host_ms']:.3f} wait_ms={med['wait_ms']:.3f} "
          f"bcast_ms={med['bcast_ms']:.3f} runs={args.repeat}", flush=True)
    cancel()


if __name__ == "__main__":
    main()

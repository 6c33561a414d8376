"""Where a CPU decode step of the native backend goes: in-process, 16 greedy requests of
32 -> 128 tokens on the bundled model, one torch thread; the time of each C call
(kernels/cpu_native.c) summed per step, and the step with the C calls stubbed out (what
Python, the scheduler, sampling and the prompts' prefill steps cost).

    python scripts/cpu_step_profile.py --runs 5
"""
import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TimedLibrary:
    """The ctypes library with each call timed (or, stubbed, not made at all)."""

    def __init__(self, lib, totals: collections.Counter, stub: bool = False):
        self.lib, self.totals, self.stub = lib, totals, stub

    def __getattr__(self, name):
        fn = getattr(self.lib, name)

        def call(*args):
            if self.stub:
                return 0
            t = time.perf_counter()
            status = fn(*args)
            self.totals[name] += time.perf_counter() - t
            return status
        return call


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    import torch

    from engine.front.llm import LLM
    from engine.request import SamplingParams
    from kernels import cpu_native
    torch.set_num_threads(1)
    llm = LLM(device="cpu", num_blocks=2048)
    if llm.engine.backend != "cpu_native":
        raise SystemExit(f"the engine runs {llm.engine.backend}, not cpu_native")
    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(1, 4000, (32,), generator=gen).tolist()}
               for _ in range(args.concurrency)]
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    llm.generate(prompts, params)                       # warm-up: packs the weights
    real, rows = cpu_native._LIB, collections.defaultdict(list)
    for _ in range(args.runs):
        for mode in ("step", "C calls", "stubbed"):
            totals = collections.Counter()
            cpu_native._LIB = real if mode == "step" else TimedLibrary(real, totals,
                                                                       mode == "stubbed")
            t = time.perf_counter()
            llm.generate(prompts, params)
            rows[mode].append((time.perf_counter() - t) / 128 * 1e3)
            for name, seconds in totals.items():
                rows[name].append(seconds / 128 * 1e3)
    cpu_native._LIB = real
    llm.engine.close()
    for name, values in rows.items():
        print(f"{name:>24}: {statistics.median(values):.2f} ms a step "
              f"({min(values):.2f}..{max(values):.2f}, {len(values)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seconds from launch to the first engine step and to the first finished request, with
the engine in its own process and in-process; each run a fresh Python process.

    python scripts/startup_time.py --runs 5        # the bundled model on the CPU
"""
import argparse
import os
import statistics
import subprocess
import sys

ONE = """
import time
t0 = time.perf_counter()
from roseplay.source import start_live
s = start_live({"num_blocks": 512}, in_process=%r)
while s.snapshot().counters.steps == 0: time.sleep(0.01)
t1 = time.perf_counter()
while s.snapshot().counters.finished == 0: time.sleep(0.01)
print("RESULT", t1 - t0, time.perf_counter() - t0)
s.close()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for label, in_process in (("engine process", False), ("in-process", True)):
        step, done = [], []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", ONE % in_process], cwd=root,
                                 capture_output=True, text=True, timeout=300).stdout
            a, b = map(float, out.split("RESULT", 1)[1].split())
            step.append(a)
            done.append(b)
        fmt = lambda xs: f"median {statistics.median(xs):.1f} s ({min(xs):.1f}..{max(xs):.1f})"  # noqa: E731
        print(f"{label:>14}: first step {fmt(step)}; first finished {fmt(done)} "
              f"over {args.runs} runs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

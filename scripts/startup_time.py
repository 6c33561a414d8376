"""Seconds from launch to the first engine step and to the first finished request, with
the engine in its own process and in-process; each run a fresh Python process.

    python scripts/startup_time.py --runs 5                      # this checkout
    python scripts/startup_time.py --runs 5 --trees /tmp/before .   # A/B, interleaved

"from launch" counts from just before the interpreter starts (the parent's clock);
"from start_live" from the child's first line (imports of the app itself excluded).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_runs import add_tree_args, interleaved, run_in_tree, spread  # noqa: E402

ONE = """
import time
t0 = time.perf_counter()
from roseplay.workload.source import start_live
s = start_live({"num_blocks": 512}, in_process=%r)
while s.snapshot().counters.steps == 0: time.sleep(0.01)
t1, wall = time.perf_counter(), time.time()
while s.snapshot().counters.finished == 0: time.sleep(0.01)
print("RESULT", t1 - t0, time.perf_counter() - t0, wall)
s.close()
"""


def measure(tree: str, in_process: bool, fresh_cache: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        # fresh_cache: a first launch, where the native CPU kernels build too
        env = {"ROSEPLAY_CACHE_DIR": cache} if fresh_cache else {}
        launch = time.time()
        out = run_in_tree(tree, ["-c", ONE % in_process], timeout=300, **env)
    if "RESULT" not in out:
        raise SystemExit(f"{tree}: no result\n{out[-3000:]}")
    step, done, wall = map(float, out.split("RESULT", 1)[1].split())
    return {"launch": wall - launch, "step": step, "done": done}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_tree_args(p)
    p.add_argument("--modes", nargs="+", default=["process", "in-process"],
                   choices=["process", "in-process"])
    p.add_argument("--fresh-cache", action="store_true",
                   help="each run in an empty ROSEPLAY_CACHE_DIR (a first launch, which "
                        "builds the native CPU kernels)")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for mode in args.modes:
        res = interleaved(args.trees, args.runs,
                          lambda tree: measure(tree, mode == "in-process", args.fresh_cache))
        for tree, r in res.items():
            print(f"{mode:>10} {tree}: first step from launch {spread(r['launch'])} s; "
                  f"from start_live {spread(r['step'])} s; first finished {spread(r['done'])} s "
                  f"over {args.runs} runs", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

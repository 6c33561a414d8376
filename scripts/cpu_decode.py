"""CPU decode throughput of the bundled model, 16 requests in flight: `roseplay bench`
(engine in its own process, default knobs) per checkout, interleaved A/B runs.

    python scripts/cpu_decode.py --runs 5 --trees /tmp/cpu_before .

Each run is a fresh `roseplay bench --device cpu --max-concurrency 16 --num-prompts 32
--input-len 32 --output-len 128` (greedy, EOS ignored): output tok/s over the run and
the median TPOT (decode step time seen by a request).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_runs import add_tree_args, interleaved, run_in_tree, spread  # noqa: E402

BENCH = ["-m", "roseplay", "bench", "--device", "cpu", "--max-concurrency", "16",
         "--num-prompts", "32", "--input-len", "32", "--output-len", "128", "--warmup", "4",
         "--no-progress"]


def measure(tree: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        run_in_tree(tree, [*BENCH, *extra, "--json", path], timeout=600)
        with open(path) as f:
            s = json.load(f)["summary"]
    return {"tok_s": s["output_throughput"], "tpot": s["tpot_ms"]["median"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_tree_args(p)
    p.add_argument("--in-process", action="store_true", help="pass --in-process to the bench")
    args = p.parse_args()
    extra = ["--in-process"] if args.in_process else []
    print(f"load average at start: {os.getloadavg()}", flush=True)
    res = interleaved(args.trees, args.runs, lambda tree: measure(tree, extra))
    for tree, r in res.items():
        print(f"{tree}: output {spread(r['tok_s'], '.0f')} tok/s; median TPOT "
              f"{spread(r['tpot'])} ms over {args.runs} runs", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

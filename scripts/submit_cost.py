"""What a burst of token-id prompts costs the client: the wall time of EngineClient.submit
(validation, the request's state, the wire) per request, with the engine in its own
process, as `roseplay bench` and `roseplay serve` submit. Each run starts a client, submits
--rounds bursts of --requests prompts of --input-len random ids (waiting for the engine to
go idle between them) and reports the median µs a submit of its rounds; checkouts are
interleaved A B A B (ab_runs.py).

    python scripts/submit_cost.py --runs 3 --trees /tmp/before .
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_runs import add_tree_args, interleaved, run_in_tree, spread  # noqa: E402


def one_run(args) -> dict:
    """In the checkout's own process: the median µs a submit over the rounds."""
    sys.path.insert(0, os.getcwd())
    from engine.front.dp_client import engine_front
    from engine.request import SamplingParams
    client = engine_front(label="submit-cost", snapshots=False, model=args.model,
                          max_num_seqs=args.requests,
                          max_num_batched_tokens=max(8192, args.input_len))
    rng, params, per = random.Random(0), SamplingParams(max_tokens=1), []
    try:
        for _ in range(args.rounds):
            prompts = [{"prompt_token_ids": [rng.randrange(args.vocab)
                                             for _ in range(args.input_len)]}
                       for _ in range(args.requests)]
            t0 = time.perf_counter()
            streams = [client.submit(p, params) for p in prompts]
            per.append((time.perf_counter() - t0) / args.requests * 1e6)
            client.wait_idle()
            del streams
    finally:
        client.close()
    return {"us_per_submit": statistics.median(per)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--vocab", type=int, default=512, help="ids drawn below this")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    add_tree_args(p, runs=3)
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_run:
        print(json.dumps(one_run(args)))
        return 0
    argv = ["--model", args.model, "--vocab", str(args.vocab), "--requests",
            str(args.requests), "--input-len", str(args.input_len), "--rounds",
            str(args.rounds), "--one-run"]

    def measure(tree: str) -> dict:
        out = run_in_tree(tree, [os.path.abspath(__file__), *argv])
        return json.loads(out.strip().splitlines()[-1])

    res = interleaved(args.trees, args.runs, measure)
    for tree in args.trees:
        xs = res[tree]["us_per_submit"]
        print(f"{tree}: µs a submit {spread(xs, '.0f')}; runs "
              + ", ".join(f"{x:.0f}" for x in xs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

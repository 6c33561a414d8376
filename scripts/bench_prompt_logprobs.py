"""What prompt_logprobs costs: one request of a P-token prompt (max_tokens 1, greedy) on
the engine process, with and without prompt_logprobs=5 (prefix cache off, so both
compute every position). Median of `repeats` end-to-end latencies.
python scripts/bench_prompt_logprobs.py [--prompt-len 256] [--device cpu]"""
from __future__ import annotations

import argparse
import statistics
import time

from engine import SamplingParams
from engine.front.client import EngineClient


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    client = EngineClient(device=args.device, num_blocks=512, label="bench",
                          enable_prefix_caching=False)
    try:
        ids = [(7 * i) % 400 + 10 for i in range(args.prompt_len)]
        for name, extra in (("plain", {}), ("prompt_logprobs=5", dict(prompt_logprobs=5))):
            params = SamplingParams(max_tokens=1, temperature=0, **extra)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                client.submit({"prompt_token_ids": ids}, params).result(120)
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"P={args.prompt_len:5d} {name:18s} median {statistics.median(times):8.1f} ms")
    finally:
        client.close()


if __name__ == "__main__":
    main()

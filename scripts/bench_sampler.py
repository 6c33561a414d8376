"""The sampler's cost per step at batch x vocab (default 256 x 151,936, Qwen2.5's vocab):
plain greedy, greedy with penalties on every row (token counts held on the device),
random with top-k/top-p, and the same with logprobs (top 5) on every row. Median of 5
repeats of `iters` steps, CUDA events. python scripts/bench_sampler.py [--batch 256]"""
from __future__ import annotations

import argparse
import statistics

import torch

from engine.batch_builder import _sampling_columns
from engine.request import Request, SamplingParams
from engine.sampling import Sampler

CASES = {
    "greedy": dict(temperature=0),
    "greedy+penalties": dict(temperature=0, frequency_penalty=0.5, presence_penalty=0.5,
                             repetition_penalty=1.1),
    "random top-k/top-p": dict(temperature=0.8, top_k=50, top_p=0.9),
    "random+penalties+logprobs5": dict(temperature=0.8, top_k=50, top_p=0.9,
                                       frequency_penalty=0.5, logprobs=5),
}


def time_case(params: dict, batch: int, vocab: int, iters: int) -> float:
    dev = torch.device("cuda")
    reqs = [Request(f"r{i}", list(range(i, i + 512)), SamplingParams(max_tokens=4096, **params))
            for i in range(batch)]
    sampler = Sampler(dev)
    logits = torch.randn(batch, vocab, device=dev, dtype=torch.bfloat16)
    cols = _sampling_columns(reqs)
    sampler.sample(logits, cols)                       # first sample: counts from prompts
    for r in reqs:
        r.output_token_ids.append(0)
    cols = _sampling_columns(reqs)                     # the steady columns
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            sampler.sample(logits, cols)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}  batch {args.batch} x vocab {args.vocab}")
    for name, params in CASES.items():
        ms = time_case(params, args.batch, args.vocab, args.iters)
        print(f"{name:28s} {ms:8.3f} ms/step")


if __name__ == "__main__":
    main()

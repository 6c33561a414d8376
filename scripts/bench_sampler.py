"""The sampler's cost per step at batch x vocab (default 256 x 151,936, Qwen2.5's vocab):
plain greedy, greedy with penalties on every row (token counts held on the device),
random with top-k/top-p, the same with logprobs (top 5) on every row, and with the
model's own top 5 too (raw_logprobs: the TUI's model-vs-processed view). Median of 5
repeats of `iters` steps (CUDA events on a GPU, perf_counter on the CPU).
python scripts/bench_sampler.py [--batch 256] [--vocab 151936] [--device cpu]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.core.batch_builder import _sampling_columns
from engine.request import Request, SamplingParams
from engine.worker.sampling import Sampler

CASES = {
    "greedy": dict(temperature=0),
    "greedy+penalties": dict(temperature=0, frequency_penalty=0.5, presence_penalty=0.5,
                             repetition_penalty=1.1),
    "random top-k/top-p": dict(temperature=0.8, top_k=50, top_p=0.9),
    "random+penalties+logprobs5": dict(temperature=0.8, top_k=50, top_p=0.9,
                                       frequency_penalty=0.5, logprobs=5),
    "same + raw view (raw_logprobs)": dict(temperature=0.8, top_k=50, top_p=0.9,
                                           frequency_penalty=0.5, logprobs=5,
                                           raw_logprobs=True),
}


def time_case(params: dict, batch: int, vocab: int, iters: int, dev: torch.device) -> float:
    reqs = [Request(f"r{i}", list(range(i, i + 512)), SamplingParams(max_tokens=4096, **params))
            for i in range(batch)]
    sampler = Sampler(dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    logits = torch.randn(batch, vocab, device=dev, dtype=dtype)
    cols = _sampling_columns(reqs)
    sampler.sample(logits, cols)                       # first sample: counts from prompts
    for r in reqs:
        r.output_token_ids.append(0)
    cols = _sampling_columns(reqs)                     # the steady columns
    times = []
    for _ in range(5):
        if dev.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(iters):
                sampler.sample(logits, cols).tolist()
            times.append((time.perf_counter() - t0) * 1e3 / iters)
            continue
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
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU x{torch.get_num_threads()}"
    print(f"{name}  batch {args.batch} x vocab {args.vocab}")
    for name, params in CASES.items():
        ms = time_case(params, args.batch, args.vocab, args.iters, dev)
        print(f"{name:32s} {ms:8.3f} ms/step")


if __name__ == "__main__":
    main()

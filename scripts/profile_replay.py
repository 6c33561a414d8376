"""Kernel times inside decode CUDA-graph replays (what the engine runs), per batch size.

PYTHONPATH=. python3 scripts/profile_replay.py [--batches 1,16,256] [--model dummy:qwen2.5-0.5b]

For each batch: fills the engine as scripts/profile_step.py does, times the bucket's graph
replay three times (50 replays each, CUDA events), then records 5 replays with the torch
profiler and prints per-kernel time per replay (CUPTI reports kernels launched by graphs).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from engine import LLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step import fill, reset, time_replay  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--batches", default="1,16,256")
    a = ap.parse_args()
    llm = LLM(model=a.model, max_num_batched_tokens=8192, max_num_seqs=512, max_model_len=2048)
    from torch.profiler import ProfilerActivity, profile
    for bs in map(int, a.batches.split(",")):
        fill(llm, bs)
        llm.engine.step()
        times = [time_replay(llm, bs) * 1e3 for _ in range(3)]
        graphs = llm.engine.executor.runner.graphs
        g = graphs.graphs[("decode", min(b for b in graphs.buckets if b >= bs))][0]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
        rows = [(e.key, e.self_device_time_total / 5, e.count / 5)
                for e in prof.key_averages() if e.self_device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"--- batch {bs}: replay ms {' '.join(f'{t:.3f}' for t in times)}; "
              f"kernel sum per replay {total / 1e3:.3f} ms")
        for name, us, n in rows[:14]:
            print(f"  {name[:56]:56s} {us:9.1f} us/replay  {n:5.0f} calls  {us / n:7.2f} us/call")
        reset(llm)


if __name__ == "__main__":
    main()

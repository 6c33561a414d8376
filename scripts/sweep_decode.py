"""Decode attention as the engine's graphs run it: every layer's call in one CUDA graph,
contexts like W1's decode phase (513..640 tokens, or --ctx LO,HI), a block table as wide
as the engine's max_model_len (8192 tokens = 512 blocks), per batch size and kernel
variant, on a preset's attention shape (--model: qwen2.5-0.5b 24 layers x 2 KV heads x 7
query heads each x 64; qwen3-0.6b 28 x 8 x 2 x 128).

PYTHONPATH=. python3 scripts/sweep_decode.py [--model dummy:qwen3-0.6b] [--batches 1,16,64,256] [--ctx 513,640] [--quick]

Variants are the tuning constants of kernels/decode_attention.py (DYNAMIC_MIN_TOKENS,
TARGET_PROGRAMS_PER_SM, NUM_STAGES) and the tile (block_n); "base" is the shipped set. Prints us per call
(median of 5 timings of 20 replays) and the KV bandwidth it reaches.
"""
import argparse
import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
import kernels.decode_attention as da  # noqa: E402

PAGE, WIDTH = 16, 512
SHAPES = {"dummy:qwen2.5-0.5b": (24, 2, 7, 64), "dummy:qwen3-0.6b": (28, 8, 2, 128)}
LAYERS, KVH, GROUP, D = SHAPES["dummy:qwen2.5-0.5b"]
CTX = (513, 640)


def make(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(CTX[0], CTX[1] + 1, (batch,), generator=g, dtype=torch.int32)
    need = [(int(n) + PAGE - 1) // PAGE for n in lens]
    blocks = sum(need)
    perm = torch.randperm(blocks, generator=g)
    table = torch.zeros(batch, WIDTH, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at:at + n]
        at += n
    dev = "cuda"
    caches = [(torch.randn(blocks, PAGE, KVH, D, device=dev, dtype=torch.bfloat16),
               torch.randn(blocks, PAGE, KVH, D, device=dev, dtype=torch.bfloat16))
              for _ in range(LAYERS)]
    q = torch.randn(batch, KVH * GROUP, D, device=dev, dtype=torch.bfloat16)
    kv_bytes = int(lens.sum()) * KVH * D * 2 * 2
    return q, caches, table.to(dev), lens.to(dev), kv_bytes


def time_variant(q, caches, table, lens, block_n) -> float:
    run = lambda: [da.paged_decode_attention(q, k, v, table, lens, D ** -0.5, block_n=block_n)
                   for k, v in caches]
    ref = run()[0]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(outs[0].float(), ref.float(), atol=2e-2, rtol=2e-2)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (20 * LAYERS))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--quick", action="store_true", help="fewer variants")
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--ctx", default="513,640", help="context lengths drawn from LO..HI")
    a = ap.parse_args()
    global LAYERS, KVH, GROUP, D, CTX
    LAYERS, KVH, GROUP, D = SHAPES[a.model]
    CTX = tuple(map(int, a.ctx.split(",")))
    grid = dict(DYNAMIC_MIN_TOKENS=[64, 128], TARGET_PROGRAMS_PER_SM=[4, 8, 16],
                NUM_STAGES=[2, 3, 4], block_n=[64, 128])
    if a.quick:
        grid = dict(DYNAMIC_MIN_TOKENS=[64], TARGET_PROGRAMS_PER_SM=[4, 8], NUM_STAGES=[2, 3],
                    block_n=[64])
    for batch in map(int, a.batches.split(",")):
        q, caches, table, lens, kv_bytes = make(batch)
        rows = []
        for values in itertools.product(*grid.values()):
            cfg = dict(zip(grid, values))
            for name, v in cfg.items():
                if name != "block_n":
                    setattr(da, name, v)
            us = time_variant(q, caches, table, lens, cfg["block_n"])
            rows.append((us, cfg))
            print(f"batch {batch:4d} {us:8.2f} us  {kv_bytes / us / 1e6:6.2f} TB/s  {cfg}",
                  flush=True)
        best = min(rows, key=lambda r: r[0])
        base = next(us for us, c in rows if c == dict(DYNAMIC_MIN_TOKENS=64,
                                                      TARGET_PROGRAMS_PER_SM=4,
                                                      NUM_STAGES=2, block_n=64))
        print(f"=== batch {batch}: base {base:.2f} us, best {best[0]:.2f} us {best[1]}", flush=True)
        del q, caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

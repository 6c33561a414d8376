"""Decode attention as the engine's graphs run it: every layer's rotary_decode_attention
(rotate, store this step's K/V, attend; --no-rope: paged_decode_attention alone) in one
CUDA graph, contexts like W1's decode phase (513..640 tokens, or --ctx LO,HI), a block
table as wide as the engine's max_model_len (8192 tokens = 512 blocks), per batch size,
KV cache dtype and kernel variant, on a preset's attention shape (--model: qwen2.5-0.5b
24 layers x 2 KV heads x 7 query heads each x 64; qwen3-0.6b 28 x 8 x 2 x 128).

PYTHONPATH=. python3 scripts/sweep_decode.py [--model dummy:qwen3-0.6b] [--batches 1,16,64,256] [--ctx 513,640] [--kv-dtype auto,fp8] [--quick]

Variants are the tuning constants of kernels/decode_attention.py (DYNAMIC_MIN_TOKENS,
TARGET_PROGRAMS_PER_SM, NUM_STAGES, MAX_REGISTERS, NUM_WARPS, CROWDED_PAIRS_PER_SM), the
tile (block_n), LONGEST_FIRST (0: programs in batch order, without decode_order), HND
(1: the caches head-major, [blocks, H_kv, page, D], read through a permuted view; the
engine's are [blocks, page, H_kv, D]) and TWO_LAUNCHES (0: always the fused rotary
launch, 1: always rotary_store_kv then the decode; -1: the kernel's own choice,
decode_attention._two_launches); "base" is the shipped set. Prints us per call (median
of 5 timings of 20 replays) and the KV bandwidth it reaches (cache bytes read: 2 bytes an
element for bf16, 1 for fp8).
"""
import argparse
import itertools
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
import kernels.decode_attention as da  # noqa: E402
from kernels.decode_order import decode_order  # noqa: E402

PAGE, WIDTH = 16, 512
SHAPES = {"dummy:qwen2.5-0.5b": (24, 2, 7, 64), "dummy:qwen3-0.6b": (28, 8, 2, 128)}
LAYERS, KVH, GROUP, D = SHAPES["dummy:qwen2.5-0.5b"]
CTX = (513, 640)
FP8 = torch.float8_e4m3fn


def make(batch: int, kv_dtype: torch.dtype, seed: int = 0, hnd: bool = False):
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
    caches = [tuple(torch.randn(blocks, PAGE, KVH, D, device=dev).to(kv_dtype)
                    for _ in range(2)) for _ in range(LAYERS)]
    # the same caches head-major (HND=1), seen through the engine's dimension order
    heads_first = None
    if hnd:
        heads_first = [tuple(torch.empty(blocks, KVH, PAGE, D, device=dev, dtype=kv_dtype)
                             .transpose(1, 2).copy_(c) for c in pair) for pair in caches]
    q = torch.randn(batch, KVH * GROUP, D, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(batch, 2, KVH, D, device=dev, dtype=torch.bfloat16)
    lens = lens.to(dev)
    pos = (lens - 1).long()
    table = table.to(dev)
    slots = table[torch.arange(batch, device=dev), pos // PAGE].long() * PAGE + pos % PAGE
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev).float() / D))
    ang = torch.arange(CTX[1] + 1, device=dev).float()[:, None] * inv[None, :]
    cos_sin = torch.cat((ang.cos(), ang.sin()), 1).to(torch.bfloat16)
    kv_bytes = int(lens.sum()) * KVH * D * 2 * kv.new_empty(0, dtype=kv_dtype).element_size()
    return dict(q=q, kv=kv, pos=pos, cos_sin=cos_sin, slots=slots, caches=caches, hnd=heads_first,
                table=table, lens=lens), kv_bytes


HND = 0               # 1: the head-major copies of the caches
LONGEST_FIRST = 1     # the engine's order (decode_order); 0: batch order, as before 2026-11-28
TWO_LAUNCHES = -1     # the kernel's choice; 0 / 1: fused / two launches for every call
_CHOOSE = da._two_launches


def time_variant(x, block_n, rope) -> float:
    da._two_launches = _CHOOSE if TWO_LAUNCHES < 0 else (lambda q, k: bool(TWO_LAUNCHES))

    def run():
        outs = []
        order = decode_order(x["lens"]) if LONGEST_FIRST else None
        for k, v in x["hnd" if HND else "caches"]:
            if rope:
                outs.append(da.rotary_decode_attention(
                    x["pos"], x["q"], x["kv"][:, 0], x["kv"][:, 1], x["cos_sin"], True, k, v,
                    x["slots"], x["table"], x["lens"], D ** -0.5, block_n=block_n, order=order))
            else:
                outs.append(da.paged_decode_attention(x["q"], k, v, x["table"], x["lens"],
                                                      D ** -0.5, block_n=block_n))
        return outs
    ref = run()[0]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(outs[0].float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert not math.isnan(float(outs[-1].float().sum()))
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


def _owner(name: str):
    """The module a grid knob lives in: this script's LONGEST_FIRST, HND and
    TWO_LAUNCHES, else the kernel's."""
    return sys.modules[__name__] if name in ("LONGEST_FIRST", "HND", "TWO_LAUNCHES") else da


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--quick", action="store_true", help="fewer variants")
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--ctx", default="513,640", help="context lengths drawn from LO..HI")
    ap.add_argument("--kv-dtype", default="auto", help="comma list of auto (bf16), fp8")
    ap.add_argument("--no-rope", action="store_true",
                    help="time paged_decode_attention alone, not the fused rotary launch")
    ap.add_argument("--grid", default="",
                    help="variants instead of the preset grid, e.g. "
                         "'NUM_STAGES=2,3;MAX_REGISTERS=0,128;block_n=64'")
    a = ap.parse_args()
    global LAYERS, KVH, GROUP, D, CTX
    LAYERS, KVH, GROUP, D = SHAPES[a.model]
    CTX = tuple(map(int, a.ctx.split(",")))
    grid = dict(DYNAMIC_MIN_TOKENS=[64, 128], TARGET_PROGRAMS_PER_SM=[4, 8, 16],
                NUM_STAGES=[2, 3, 4], block_n=[64, 128])
    if a.quick:
        grid = dict(DYNAMIC_MIN_TOKENS=[64], TARGET_PROGRAMS_PER_SM=[4, 8], NUM_STAGES=[2, 3],
                    block_n=[64])
    if a.grid:
        grid = {k: [int(v) for v in vals.split(",")]
                for k, vals in (item.split("=") for item in a.grid.split(";"))}
    knobs = [name for name in grid if name != "block_n"]
    shipped = {name: getattr(_owner(name), name) for name in knobs}
    for kv_name in a.kv_dtype.split(","):
        kv_dtype = FP8 if kv_name == "fp8" else torch.bfloat16
        for batch in map(int, a.batches.split(",")):
            x, kv_bytes = make(batch, kv_dtype, hnd=1 in grid.get("HND", ()))
            rows = []
            for values in itertools.product(*grid.values()):
                cfg = dict(zip(grid, values))
                for name in knobs:
                    v = cfg[name]
                    setattr(_owner(name), name, v or None if name == "MAX_REGISTERS" else v)
                us = time_variant(x, cfg.get("block_n"), not a.no_rope)
                rows.append((us, cfg))
                print(f"{kv_name} batch {batch:4d} {us:8.2f} us  {kv_bytes / us / 1e6:6.2f} TB/s"
                      f"  {cfg}", flush=True)
            best = min(rows, key=lambda r: r[0])
            print(f"=== {kv_name} batch {batch}: first {rows[0][0]:.2f} us "
                  f"{kv_bytes / rows[0][0] / 1e6:.2f} TB/s, best {best[0]:.2f} us "
                  f"{kv_bytes / best[0] / 1e6:.2f} TB/s {best[1]}", flush=True)
            for name, v in shipped.items():
                setattr(_owner(name), name, v)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

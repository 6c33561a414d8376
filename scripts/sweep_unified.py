"""The mixed step's attention (paged_unified_attention) at W1's shapes, per tile variant:
240 decodes at contexts 512..639 beside 16 chunks of 512 new tokens ("mixed"), each part
alone ("decodes", "chunks"), 64 decodes at ~1.9k tokens ("decodes@2k") and 4 chunks of
2048 ("chunks@2k"), on a preset's attention shape (--model: qwen2.5-0.5b 14 query heads
x 2 KV heads x 64, qwen3-0.6b 16 x 8 x 128), bf16 queries, a bf16 or fp8 cache.

PYTHONPATH=. python3 scripts/sweep_unified.py [--model dummy:qwen3-0.6b] [--kv-dtype auto,fp8]
    [--variants 'base;block_m=64,decode_m=64,decode_n=64;num_stages=2']

A variant is `base` (the kernel's own tiles, unified_attention.default_config) or a
comma list of paged_unified_attention's tile knobs (block_m, block_n, decode_m,
decode_n, num_warps, num_stages). Prints µs a launch (median of 7 timings of 20 CUDA
graph replays, with min..max) and each variant's largest difference from the first's
output (bf16 rounding where the tiles differ).
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from kernels.unified_attention import paged_unified_attention  # noqa: E402

PAGE = 16
SHAPES = {"dummy:qwen2.5-0.5b": (14, 2, 64), "dummy:qwen3-0.6b": (16, 8, 128)}
DECODES = [(1, 512 + k % 128) for k in range(240)]
CHUNKS = [(512, 512)] * 16
MIXES = {"mixed": DECODES + CHUNKS, "decodes": DECODES, "chunks": CHUNKS,
         "decodes@2k": [(1, 1800 + 3 * k) for k in range(64)],
         "chunks@2k": [(2048, 2048)] * 4}


def make(mix, heads: int, kv_heads: int, d: int, kv_dtype: torch.dtype):
    """(positional args, fp8 scales) of one launch: (new tokens, context) per sequence,
    decodes first as the engine lays them out, blocks scattered over the cache."""
    news = [n for n, _ in mix]
    need = [-(-c // PAGE) for _, c in mix]
    blocks = sum(need) + 8
    kc, vc = (torch.randn(blocks, PAGE, kv_heads, d, device="cuda").to(kv_dtype)
              for _ in range(2))
    tables = torch.zeros(len(mix), max(need) + 2, dtype=torch.int32, device="cuda")
    perm, at = torch.randperm(blocks, device="cuda").int(), 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[at:at + n]
        at += n
    q = torch.randn(sum(news), heads, d, device="cuda", dtype=torch.bfloat16)
    qsl = torch.tensor([0] + news, device="cuda").cumsum(0).int()
    lens = torch.tensor([c for _, c in mix], dtype=torch.int32, device="cuda")
    scales = {}
    if kv_dtype != torch.bfloat16:
        scales = {"k_scale": torch.ones(kv_heads, device="cuda"),
                  "v_scale": torch.ones(kv_heads, device="cuda")}
    return (q, kc, vc, tables, qsl, lens, d ** -0.5), scales


def time_launch(args, knobs, replays: int = 20) -> list[float]:
    """µs a launch over 7 timings of a graph of `replays` launches."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            paged_unified_attention(*args, **knobs)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    return times


def parse_variants(text: str) -> list[tuple[str, dict]]:
    out = []
    for v in filter(None, (s.strip() for s in text.split(";"))):
        knobs = {} if v == "base" else {k: int(x) for k, x in
                                        (kv.split("=") for kv in v.split(","))}
        out.append((v, knobs))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--kv-dtype", default="auto", help="comma list of auto (bf16), fp8")
    ap.add_argument("--mixes", default=",".join(MIXES), help="comma list of " + ", ".join(MIXES))
    ap.add_argument("--variants", default="base",
                    help="';'-separated: base, or knob=value,... (block_m, block_n, decode_m, "
                         "decode_n, num_warps, num_stages)")
    a = ap.parse_args()
    heads, kv_heads, d = SHAPES[a.model]
    variants = parse_variants(a.variants)
    torch.manual_seed(0)
    for kv in a.kv_dtype.split(","):
        kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
        for name in a.mixes.split(","):
            args, scales = make(MIXES[name], heads, kv_heads, d, kv_dtype)
            first, cells = None, []
            for label, knobs in variants:
                knobs = dict(knobs, **scales)
                out = paged_unified_attention(*args, **knobs).float()
                first = out if first is None else first
                t = time_launch(args, knobs)
                diff = (out - first).abs().max().item()
                cells.append(f"{label}: {statistics.median(t):.1f} ({min(t):.1f}..{max(t):.1f})"
                             f" diff {diff:.0e}")
            print(f"{a.model} {kv} {name:10s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""The MLP's gate_up projection and SwiGLU at many rows: cuBLAS then silu_and_mul (two
passes over [M, 2I]) against kernels/mlp.py's gate_up_silu (one GEMM, SwiGLU in
its epilogue), per model shape and row count, and a sweep of the kernel's tiles.

PYTHONPATH=. python3 scripts/bench_gate_up_silu.py [--rows 2048,4096,8192]
    [--models qwen2.5-0.5b,qwen3-0.6b,llama-3.2-1b] [--sweep] [--repeat 5]

Each figure is the median of --repeat timings, each the mean of 20 launches between CUDA
events (a layer's weights, 9-33 MB, stay in L2 across launches as in no real step: the
24-28 layers of a model each bring their own, so both sides are favoured alike); min..max
beside it. The kernel's result is checked against the two-op path first (bf16: max
difference printed).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import os

import torch

sys.path.insert(0, os.getcwd())
from kernels import mlp as S  # noqa: E402
from kernels.activation import silu_and_mul  # noqa: E402

SHAPES = {"qwen2.5-0.5b": (896, 4864), "qwen3-0.6b": (1024, 3072), "llama-3.2-1b": (2048, 8192)}
TILES = [(128, 128, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 64, 64, 4, 4, 8),
         (128, 128, 128, 2, 8, 8), (64, 128, 64, 4, 4, 8), (128, 128, 64, 3, 8, 16), (128, 128, 32, 4, 8, 8), (64, 128, 64, 3, 4, 8),
         (128, 256, 64, 3, 8, 8)]


def timed(fn, repeat: int) -> tuple[float, float, float]:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 20 * 1e3)      # us a call
    return statistics.median(times), min(times), max(times)


def set_tiles(bm, bn, bk, stages, warps, group) -> None:
    S.BLOCK_M, S.BLOCK_N, S.BLOCK_K, S.NUM_STAGES, S.NUM_WARPS, S.GROUP_M = \
        bm, bn, bk, stages, warps, group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2048,4096,8192", help="row counts M")
    ap.add_argument("--models", default=",".join(SHAPES), help="model shapes (K, I)")
    ap.add_argument("--sweep", action="store_true", help="time every tile of TILES too")
    ap.add_argument("--repeat", type=int, default=5, help="timings per figure")
    args = ap.parse_args()
    default = (S.BLOCK_M, S.BLOCK_N, S.BLOCK_K, S.NUM_STAGES, S.NUM_WARPS, S.GROUP_M)
    for name in args.models.split(","):
        k, inter = SHAPES[name]
        w = torch.randn(2 * inter, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            two = lambda: silu_and_mul(torch.nn.functional.linear(x, w))   # noqa: E731
            diff = (S.gate_up_silu(x, w).float() - two().float()).abs().max().item()
            flop = 2 * m * k * 2 * inter
            base = timed(two, args.repeat)
            line = f"{name} M {m:5d}  cuBLAS+silu_and_mul {base[0]:8.1f} us " \
                   f"({base[1]:.1f}..{base[2]:.1f})"
            for tiles in [default] + (TILES if args.sweep else []):
                set_tiles(*tiles)
                try:
                    t = timed(lambda: S.gate_up_silu(x, w), args.repeat)
                except Exception as exc:         # a tile that does not fit
                    line += f"\n   gate_up_silu {tiles}: {type(exc).__name__}"
                    continue
                line += f"\n   gate_up_silu {tiles}: {t[0]:8.1f} us ({t[1]:.1f}..{t[2]:.1f})" \
                        f"  {flop / t[0] / 1e6:5.0f} TFLOP/s  x{t[0] / base[0]:.3f}"
            set_tiles(*default)
            gemm = timed(lambda: torch.nn.functional.linear(x, w), args.repeat)
            print(f"{line}\n   (cuBLAS gate_up alone {gemm[0]:.1f} us, "
                  f"{flop / gemm[0] / 1e6:.0f} TFLOP/s; max |diff| {diff:.4f})", flush=True)


if __name__ == "__main__":
    main()

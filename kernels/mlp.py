"""gated_mlp, the MLP block of the Triton backend, and gate_up_silu: the gate_up
projection with SwiGLU as its epilogue, for many rows.

  gated_mlp(x, norm_w, eps, gate_up_w, gate_up_b, down_w, down_b, residual)
      h, new_residual = rms_norm(x, norm_w, eps, residual)
      y = silu_and_mul(h @ gate_up_w^T + b) @ down_w^T + b        -> (y, new_residual)
  gate_up_silu(h, weight)    = silu_and_mul(h @ weight^T), weight [2I, K] = [gate | up]

Up to GATE_UP_SILU_MIN_M rows gated_mlp is kernels/linear.py's rms_norm_linear then
silu_mul_linear (the skinny GEMMs fuse the norm and the activation into their
prologues); above it, rms_norm, gate_up_silu, then the down projection on cuBLAS.

Above the skinny GEMM's rows (prefill and mixed steps) the gate_up projection runs on
cuBLAS and writes [M, 2I], which silu_and_mul reads back to write [M, I]: at M = 8192 on
qwen2.5-0.5b that is 240 MB a layer through HBM for an elementwise op. Here each program
computes a [BLOCK_M, BLOCK_N] tile of gate AND the same columns of up (two accumulators,
the weight's rows n and I + n), then writes silu(gate) * up only.

Persistent grid (one program per SM, tiles grouped GROUP_M rows of tiles at a time for
L2 reuse of the weight); operands through TMA descriptors (Hopper) and tl.dot on tensor
cores, fp32 accumulation. Gate and up are rounded to x.dtype before the activation, as
the unfused path rounds cuBLAS's output, then the math runs in fp32 as silu_and_mul's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._common import num_sms
from kernels.linear import linear, rms_norm_linear, silu_mul_linear
from kernels.norm import rms_norm

GATE_UP_SILU_MIN_M = 64         # more rows than this: gate_up_silu

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64
GROUP_M = 8
NUM_STAGES, NUM_WARPS = 3, 8


@triton.jit
def _gate_up_silu_kernel(x_desc, w_desc, y_desc, M, I, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         NUM_PROGRAMS: tl.constexpr, STAGES: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(I, BLOCK_N)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=True):
        group = tile // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(tiles_m - first_m, GROUP_M)
        m0 = (first_m + (tile % per_group) % size_m) * BLOCK_M
        n0 = ((tile % per_group) // size_m) * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            a = x_desc.load([m0, k0])
            acc_g = tl.dot(a, w_desc.load([n0, k0]).T, acc_g)
            acc_u = tl.dot(a, w_desc.load([I + n0, k0]).T, acc_u)
        gate = acc_g.to(y_desc.dtype).to(tl.float32)
        up = acc_u.to(y_desc.dtype).to(tl.float32)
        y_desc.store([m0, n0], (gate / (1.0 + tl.exp(-gate)) * up).to(y_desc.dtype))


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Shapes and layouts the kernel takes: CUDA bf16/fp16, no bias, contiguous rows,
    I a multiple of BLOCK_N (the up rows of a tile never spill into the next gate tile),
    16-byte aligned rows for TMA."""
    if not x.is_cuda or bias is not None or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    if weight.dtype != x.dtype or weight.dim() != 2 or not weight.is_contiguous():
        return False
    two_i, k = weight.shape
    return (x.shape[-1] == k and two_i % (2 * BLOCK_N) == 0 and k % 8 == 0
            and x.stride(-1) == 1)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu_and_mul(x @ weight^T): x [..., K], weight [2I, K] -> [..., I] (`fits` holds)."""
    k = x.shape[-1]
    inter = weight.shape[0] // 2
    x2 = x.reshape(-1, k)
    if x2.stride(0) != k:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, inter), dtype=x.dtype, device=x.device)
    if m:
        x_desc = TensorDescriptor.from_tensor(x2, [BLOCK_M, BLOCK_K])
        w_desc = TensorDescriptor.from_tensor(weight, [BLOCK_N, BLOCK_K])
        y_desc = TensorDescriptor.from_tensor(y, [BLOCK_M, BLOCK_N])
        tiles = triton.cdiv(m, BLOCK_M) * (inter // BLOCK_N)
        programs = min(tiles, num_sms(x.device))
        _gate_up_silu_kernel[(programs,)](
            x_desc, w_desc, y_desc, m, inter, k, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, NUM_PROGRAMS=programs, STAGES=NUM_STAGES,
            num_warps=NUM_WARPS)
    return y.view(*x.shape[:-1], inter)


def gated_mlp(x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
              gate_up_weight: torch.Tensor, gate_up_bias: torch.Tensor | None,
              down_weight: torch.Tensor, down_bias: torch.Tensor | None,
              residual: torch.Tensor):
    """kernels/reference.py gated_mlp: (y, new_residual)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows > GATE_UP_SILU_MIN_M and fits(x, gate_up_weight, gate_up_bias):
        h, new_residual = rms_norm(x, norm_weight, eps, residual)
        return linear(gate_up_silu(h, gate_up_weight), down_weight, down_bias), new_residual
    gate_up, new_residual = rms_norm_linear(x, norm_weight, eps, gate_up_weight,
                                            gate_up_bias, residual)
    return silu_mul_linear(gate_up, down_weight, down_bias), new_residual

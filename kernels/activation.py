"""silu_and_mul: x [T, 2I] = [gate | up] -> silu(gate) * up, [T, I], math in fp32.

Grid (T, cdiv(I, BLOCK)): each program reads BLOCK gate and BLOCK up values of one row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._common import check_float, next_pow2
from kernels.pdl import pdl_enter


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pdl_enter(PDL)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up, [T, I]."""
    check_float(x)
    two_i = x.shape[-1]
    assert two_i % 2 == 0, two_i
    inter = two_i // 2
    x2 = x.reshape(-1, two_i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if rows > 0 and inter > 0:
        block = min(1024, next_pow2(inter))
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            x2, out, inter, x2.stride(0), out.stride(0), BLOCK=block,
            num_warps=max(1, min(4, block // 256)), **pdl.launch_args(x.device),
        )
    return out.view(*x.shape[:-1], inter)

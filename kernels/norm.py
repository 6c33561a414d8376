"""rms_norm with an optional fused residual add, one program per row.

With residual: h = (x + residual) rounded to x.dtype (what the reference does), written
out as the new residual, then out = h * rsqrt(mean(h^2) + eps) * weight, in fp32, rounded
to x.dtype. The whole row sits in registers (BLOCK = next power of two >= hidden size).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._common import check_float, next_pow2
from kernels.pdl import pdl_enter


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, eps,
    stride_x, stride_r, stride_o, stride_nr,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    pdl_enter(PDL)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_res_ptr + row * stride_nr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, 0) / N
    rstd = tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (xf * rstd * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim. With residual: h = x + residual, returns (norm(h), h)."""
    check_float(x, weight)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    has_res = residual is not None
    if has_res:
        r2 = residual.reshape(-1, n)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        new_res = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    else:
        r2 = new_res = out                                  # unused
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    if rows > 0:
        block = next_pow2(n)
        _rms_norm_kernel[(rows,)](
            x2, r2, w, out, new_res, float(eps),
            x2.stride(0), r2.stride(0), out.stride(0), new_res.stride(0),
            N=n, BLOCK=block, HAS_RES=has_res,
            num_warps=max(1, min(16, block // 256)), **pdl.launch_args(x.device),
        )
    out = out.view(x.shape)
    return out if not has_res else (out, new_res.view(x.shape))

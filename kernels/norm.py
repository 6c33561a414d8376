"""rms_norm with an optional fused residual add, a tile of rows per program.

With residual: h = (x + residual) rounded to x.dtype (what the reference does), written
out as the new residual, then out = h * rsqrt(mean(h^2) + eps) * weight, in fp32, rounded
to x.dtype. Each row sits whole in registers (BLOCK = next power of two >= its length).

Rows are read where they lie: a [T, H, D] view (qwen3's per-head q and k norms, one
launch over the qkv output's first H + H_kv heads with a weight row per head) is normed
over D without first copying it contiguous, and short rows go TILE_ELEMS' worth to a
program. One 128-element row a one-warp program, after a
copy, made these norms ~30 % of a qwen3-0.6b prefill step (docs/KERNELS.md "Small
kernels").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._common import check_float, next_pow2
from kernels.pdl import pdl_enter

TILE_ELEMS = 1024       # elements a program holds: 8 rows of 128; longer rows one each


# rows varies with the batch: not specialized on, so a new batch size compiles nothing
@triton.jit(do_not_specialize=["rows"])
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, eps, rows, heads,
    stride_xt, stride_xh, stride_r, stride_o, stride_nr, stride_wh,
    N: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, HAS_RES: tl.constexpr,
    HEAD_W: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs = tl.arange(0, BLOCK)
    mask = (row < rows)[:, None] & (offs < N)[None, :]
    x_row = (row // heads) * stride_xt + (row % heads) * stride_xh
    x = tl.load(x_ptr + x_row[:, None] + offs[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row[:, None] * stride_r + offs[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_res_ptr + row[:, None] * stride_nr + offs[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 1) / N + eps)
    if HEAD_W:      # a weight row per head
        w = tl.load(w_ptr + (row % heads)[:, None] * stride_wh + offs[None, :], mask=mask,
                    other=0.0).to(tl.float32)
    else:
        w = tl.load(w_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + row[:, None] * stride_o + offs[None, :],
             (xf * rstd[:, None] * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """x as (tensor, heads, row stride, head stride): row r = t * heads + h starts at
    t * stride_t + h * stride_h. A 2-D or 3-D x with a contiguous last dim is read where
    it lies; anything else is copied into contiguous rows first."""
    if x.stride(-1) == 1 and x.dim() == 3:
        return x, x.shape[1], x.stride(0), x.stride(1)
    if x.stride(-1) == 1 and x.dim() == 2:
        return x, 1, x.stride(0), 0
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return flat, 1, flat.stride(0), 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim. With residual: h = x + residual, returns (norm(h), h).
    weight [D], or [H, D] for a [T, H, D] x: a weight row per head (as torch broadcasts)."""
    check_float(x, weight)
    n = x.shape[-1]
    has_res = residual is not None
    head_w = weight.dim() == 2
    if head_w and (has_res or x.dim() != 3 or tuple(weight.shape) != tuple(x.shape[1:])):
        raise ValueError(f"a per-head weight {tuple(weight.shape)} needs a [T, H, D] x "
                         f"without residual, got {tuple(x.shape)}")
    src, heads, stride_t, stride_h = _rows_of(x if not has_res else x.reshape(-1, n))
    rows = src.shape[0] * heads
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    r2 = new_res = out                                      # unused without a residual
    if has_res:
        r2 = residual.reshape(-1, n)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        new_res = torch.empty_like(out)
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    if rows > 0:
        block = next_pow2(n)
        block_r = max(1, TILE_ELEMS // block)
        _rms_norm_kernel[(triton.cdiv(rows, block_r),)](
            src, r2, w, out, new_res, float(eps), rows, heads,
            stride_t, stride_h, r2.stride(0), out.stride(0), new_res.stride(0),
            w.stride(0) if head_w else 0,
            N=n, BLOCK=block, BLOCK_R=block_r, HAS_RES=has_res, HEAD_W=head_w,
            num_warps=max(1, min(16, block_r * block // 256)), **pdl.launch_args(x.device),
        )
    out = out.view(x.shape)
    return out if not has_res else (out, new_res.view(x.shape))

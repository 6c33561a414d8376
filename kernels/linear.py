"""linear: y = x @ W^T (+ bias) for skinny x (decode batches), W [N, K] in nn.Linear layout.

At batch 1..16 a projection reads its whole weight to produce a few rows, so it is bound
by how fast W streams from memory. cuBLAS picks tiles made for large M and reaches ~1.3
TB/s on Qwen2.5-0.5B's projections at batch 1 (docs/KERNELS.md); this kernel is built for
the weight stream instead.

Grid (cdiv(N, BLOCK_N), SPLIT_K). Program (n, s) reads the [BLOCK_N, K/SPLIT_K] slab of W
(K contiguous: 16-byte loads, BLOCK_K columns a step, software-pipelined by Triton) and
all M rows of x for that K range, and accumulates in fp32:
  * DOT (M > 1, or when chosen for M = 1): acc[BLOCK_N, BLOCK_M] += W_tile @ x_tile^T on
    tensor cores, x padded to BLOCK_M >= 16 rows with zeros (the "swap AB" form, so the
    weight tile is the large MMA operand);
  * FMA (M = 1): acc[BLOCK_N, BLOCK_K] += W_tile * x_row, summed over K at the end.
Split-K partial sums are merged one of three ways (REDUCE):
  1 = fp32 partials [SPLIT_K, M, N], then a second small kernel sums them (2 launches);
  2 = fp32 partials; each program then bumps a per-N-tile counter (atomic, acq_rel) and
      the last of the SPLIT_K programs of a tile sums the partials in split order
      (deterministic), adds the bias, writes y and resets the counter to 0 (1 launch);
  3 = fp32 atomic adds into a zeroed [M, N] buffer; the last program (same counter)
      reads it, writes y and re-zeroes it (1 launch; summation order varies run to run).
The counters and the REDUCE 3 buffer are persistent, zeroed once, and left zeroed by
every launch, so the kernel needs no memset and is CUDA-graph safe. They are shared by
all calls on a device, which is safe as long as launches on that device do not run
concurrently on several streams (the engine runs one stream).

The grid and every constexpr come from shapes only; no host sync. M above the skinny
limit (or unusual dtypes / layouts) falls back to torch (cuBLAS).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import dot_precision, next_pow2, num_sms, zeroed_scratch

# Rows at or below which the Triton kernel runs; above it, cuBLAS (measured crossover,
# docs/KERNELS.md "linear").
SKINNY_MAX_M = 16
DEFAULT_REDUCE = 2


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    REDUCE: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, PREC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)      # clamped: weight loads need no mask
    w_rows = w_ptr + rows[:, None] * stride_wn
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)

    if USE_DOT:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(w_rows + offs_k[None, :] * stride_wk)
                x = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None] * stride_xk,
                            mask=m_mask[None, :], other=0.0)
            else:
                k_mask = offs_k < K
                w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=k_mask[None, :],
                            other=0.0)
                x = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None] * stride_xk,
                            mask=m_mask[None, :] & k_mask[:, None], other=0.0)
            acc = tl.dot(w, x, acc, input_precision=PREC)
    else:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(w_rows + offs_k[None, :] * stride_wk)
                x = tl.load(x_ptr + offs_k * stride_xk)
            else:
                k_mask = offs_k < K
                w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=k_mask[None, :],
                            other=0.0)
                x = tl.load(x_ptr + offs_k * stride_xk, mask=k_mask, other=0.0)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
        acc = tl.sum(acc2, 1)[:, None]                            # BLOCK_M == 1

    out_mask = n_mask[:, None] & m_mask[None, :]
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None] * stride_yn
    if REDUCE == 0:                         # no split: this program owns its outputs
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    elif REDUCE == 3:
        mn = offs_m[None, :] * N + offs_n[:, None]                 # [BLOCK_N, BLOCK_M]
        tl.atomic_add(ws_ptr + mn, acc, mask=out_mask, sem="relaxed")
        tl.debug_barrier()                  # every thread's adds before the release below
        done = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if done == split_k - 1:
            tl.store(cnt_ptr + pid_n, 0)
            total = tl.load(ws_ptr + mn, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(ws_ptr + mn, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), mask=out_mask)
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        mn = offs_m[None, :] * N + offs_n[:, None]
        tl.store(ws_ptr + pid_k * M * N + mn, acc, mask=out_mask)
        if REDUCE == 2:
            tl.debug_barrier()              # every thread's partial before the release below
            done = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if done == split_k - 1:
                tl.store(cnt_ptr + pid_n, 0)
                total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
                for s in range(0, split_k):
                    total += tl.load(ws_ptr + s * M * N + mn, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(b_ptr + offs_n, mask=n_mask,
                                     other=0.0).to(tl.float32)[:, None]
                tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _linear_reduce_kernel(ws_ptr, b_ptr, y_ptr, M, N, split_k, stride_ym, stride_yn,
                          BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    m = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    total = tl.zeros([BLOCK], tl.float32)
    for s in range(0, split_k):
        total += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + offs * stride_yn, total.to(y_ptr.dtype.element_ty),
             mask=mask)


def plan_linear(m: int, n: int, k: int, sms: int) -> dict:
    """Tiles and split-K from shapes only (graph safe). Tuned on H100 (docs/KERNELS.md)."""
    use_dot = m > 1
    block_m = max(16, next_pow2(m)) if use_dot else 1
    block_k = 128
    # enough N tiles to cover the multiprocessors with wide tiles if possible
    block_n = 16
    for bn in (128, 64, 32):
        if triton.cdiv(n, bn) >= sms:
            block_n = bn
            break
    tiles = triton.cdiv(n, block_n)
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min((2 * sms) // tiles, k_tiles // 2))
    return {"block_m": block_m, "block_n": block_n, "block_k": block_k, "split_k": split,
            "num_warps": 4, "num_stages": 4, "use_dot": use_dot, "reduce": DEFAULT_REDUCE}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           max_m: int | None = None, **overrides) -> torch.Tensor:
    """y = x @ weight^T + bias (F.linear semantics). x [..., K], weight [N, K], bias [N].

    Skinny x (at most SKINNY_MAX_M rows) runs the Triton kernel; anything else, torch.
    Keyword overrides (block_n, block_k, split_k, num_warps, num_stages, use_dot, reduce)
    exist for the tests and the benchmark sweep; callers leave them unset.
    """
    k = x.shape[-1]
    n = weight.shape[0]
    m = x.numel() // k if k else 0
    limit = SKINNY_MAX_M if max_m is None else max_m
    if (m == 0 or m > limit or k == 0 or weight.dim() != 2 or weight.shape[1] != k
            or x.dtype != weight.dtype or x.dtype not in (torch.float32, torch.float16,
                                                         torch.bfloat16)
            or (bias is not None and (bias.dim() != 1 or bias.shape[0] != n))
            or x.device != weight.device):
        return F.linear(x, weight, bias)
    x2 = x.reshape(m, k)
    cfg = plan_linear(m, n, k, num_sms(x.device))
    cfg.update({key: v for key, v in overrides.items() if v is not None})
    if cfg["use_dot"]:
        cfg["block_m"] = max(16, next_pow2(m))
    else:
        assert m == 1, "the FMA path handles one row"
        cfg["block_m"] = 1
    block_k, block_n = cfg["block_k"], cfg["block_n"]
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min(cfg["split_k"], k_tiles))
    k_per_split = triton.cdiv(k_tiles, split) * block_k
    split = triton.cdiv(k, k_per_split)
    reduce = cfg["reduce"] if split > 1 else 0
    tiles = triton.cdiv(n, block_n)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cnt = ws = y
    if reduce in (2, 3):
        cnt = zeroed_scratch(x.device, "linear_counters", tiles, torch.int32)
    if reduce in (1, 2):
        ws = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    elif reduce == 3:
        ws = zeroed_scratch(x.device, "linear_accum", m * n, torch.float32)
    b = bias if bias is not None else y
    _linear_kernel[(tiles, split)](
        x2, weight, b, y, ws, cnt, m, n, k, k_per_split, split,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
        y.stride(0), y.stride(1),
        BLOCK_M=cfg["block_m"], BLOCK_N=block_n, BLOCK_K=block_k,
        REDUCE=reduce, HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0,
        USE_DOT=cfg["use_dot"], PREC=dot_precision(x.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if reduce == 1:
        block = min(1024, next_pow2(n))
        _linear_reduce_kernel[(triton.cdiv(n, block), m)](
            ws, b, y, m, n, split, y.stride(0), y.stride(1),
            BLOCK=block, HAS_BIAS=bias is not None, num_warps=4)
    return y.view(*x.shape[:-1], n)

"""paged_extend_attention: causal flash attention of a chunk of new tokens per sequence
over its cached prefix plus the chunk itself, K/V read through the block table.

Grid (cdiv(max_seqlen_q * GROUP, BLOCK_M), B, H_kv). GQA packing: the M rows of a program
are (token, head) pairs of one KV head, row r = token r // GROUP, query head
kvh * GROUP + r % GROUP, so the GROUP heads that share a K/V tile read it once and any
group size (1, 2, 7, ...) fills the tensor-core M dimension. Query token i of sequence b
sits at position ctx_b - n_b + i and sees KV positions [0, pos]. The KV loop has two
parts: tiles wholly at or below the program's first position (no mask), then the
diagonal tiles up to its last position (causal mask). Programs past n_b * GROUP return.
Online softmax in fp32 with exp2 and the scale folded into log2(e). An fp8 cache's tiles
are converted to q's dtype in registers; the KV head's K scale joins the score scale and
its V scale the output (kernels/_attn_tile.py).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._attn_tile import attend_tile
from kernels._common import check_float, check_kv, dot_precision, next_pow2


@triton.jit
def attend_chunk_rows(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2, b, kvh, q_start, n_q,
    ctx, row0,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btm,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PREC: tl.constexpr,
    FP8: tl.constexpr,
):
    """Packed rows [row0, row0 + BLOCK_M) of sequence b's chunk (n_q tokens ending at KV
    position ctx, query rows from q_start): causal attention over the paged prefix and
    the chunk, written to out. Shared by the extend and the unified kernels."""
    first = ctx - n_q                       # position of the chunk's first token
    rows = row0 + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    heads = kvh * GROUP + rows % GROUP
    row_valid = tok < n_q
    pos = first + tok
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh
    io_mask = row_valid[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :] * stride_qd, mask=io_mask,
                other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    k_head = k_ptr + kvh.to(tl.int64) * stride_kh
    v_head = v_ptr + kvh.to(tl.int64) * stride_vh
    vs = 1.0
    if FP8:         # this KV head's scales: K's into the scores, V's into the output
        scale_log2 = scale_log2 * tl.load(ks_ptr + kvh)
        vs = tl.load(vs_ptr + kvh)

    pos_lo = first + row0 // GROUP                                  # first row's position
    pos_hi = first + tl.minimum((row0 + BLOCK_M - 1) // GROUP, n_q - 1)
    full_end = ((pos_lo + 1) // BLOCK_N) * BLOCK_N                  # tiles all visible

    for n0 in range(0, full_end, BLOCK_N):          # tiles every row sees in full
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, n0 + offs_n, offs_n, offs_n, bt_row, k_head, v_head, offs_d,
            d_mask, stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
            stride_vd, scale_log2, HEAD_DIM, PAGE, PREC, False)
    for n0 in range(full_end, pos_hi + 1, BLOCK_N):  # the causal diagonal
        kv = n0 + offs_n
        kv_valid = kv <= pos_hi
        visible = (kv[None, :] <= pos[:, None]) & kv_valid[None, :]
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, kv, kv_valid, visible, bt_row, k_head, v_head, offs_d,
            d_mask, stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
            stride_vd, scale_log2, HEAD_DIM, PAGE, PREC, True)

    out = acc * (vs / tl.where(l_i > 0.0, l_i, 1.0))[:, None]
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit(do_not_specialize=["stride_btb"])   # table width varies per step
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, ctx_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btm,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PREC: tl.constexpr,
    FP8: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    n_q = tl.load(cu_ptr + b + 1) - q_start
    row0 = pid_m * BLOCK_M
    if row0 >= n_q * GROUP:
        return
    attend_chunk_rows(
        q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2, b, kvh, q_start,
        n_q, tl.load(ctx_ptr + b), row0,
        stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
        stride_vb, stride_vs, stride_vh, stride_vd, stride_btb, stride_btm,
        stride_ot, stride_oh, stride_od,
        GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PAGE, PREC, FP8)


def default_config(rows: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Tile shape from the packed row count (max_seqlen_q * GROUP), head_dim and dtype.

    16-bit, head_dim <= 64: 64 x 64 tiles, 4 warps, 2 stages; head_dim 128: 128 x 64
    tiles, 4 warps, 3 stages (best or within 1% of best of 24 variants at each swept point
    on an H100, docs/KERNELS.md). head_dim 256: 64 x 32 on 8 warps (not measured). Short
    chunks take fewer rows. float32 uses exact (non-tf32) dots on FMA units, so it takes
    small tiles to stay out of local memory.
    """
    if dtype == torch.float32:
        return {"block_m": 16, "block_n": 32 if head_dim <= 64 else 16, "num_warps": 4,
                "num_stages": 2}
    if head_dim <= 64:
        return {"block_m": max(16, min(64, next_pow2(rows))), "block_n": 64,
                "num_warps": 4, "num_stages": 2}
    if head_dim <= 128:
        return {"block_m": max(16, min(128, next_pow2(rows))), "block_n": 64,
                "num_warps": 4, "num_stages": 3}
    return {"block_m": max(16, min(64, next_pow2(rows))), "block_n": 32,
            "num_warps": 8 if rows >= 64 else 4, "num_stages": 2}


def paged_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           context_lens: torch.Tensor, max_seqlen_q: int, scale: float,
                           *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, block_m: int | None = None,
                           block_n: int | None = None, num_warps: int | None = None,
                           num_stages: int | None = None) -> torch.Tensor:
    """Causal attention of new tokens q [T, H, D] over cached prefix plus themselves; an
    fp8 cache is read with its per-head scales (k_scale, v_scale [H_kv]; None: unit).

    The tile knobs exist for the benchmark sweep; callers leave them unset.
    """
    check_float(q)
    ks, vs, fp8 = check_kv(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    batch = cu_seqlens_q.shape[0] - 1
    if num_tokens == 0 or batch <= 0 or max_seqlen_q <= 0:
        return out
    group = num_heads // num_kv_heads
    cfg = default_config(max_seqlen_q * group, head_dim, q.dtype)
    block_m = block_m or cfg["block_m"]
    block_n = block_n or cfg["block_n"]
    grid = (triton.cdiv(max_seqlen_q * group, block_m), batch, num_kv_heads)
    _extend_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, ks, vs,
        scale * math.log2(math.e),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(),
        *out.stride(),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)),
        BLOCK_M=block_m, BLOCK_N=block_n, PAGE=k_cache.shape[1],
        PREC=dot_precision(q.dtype), FP8=fp8,
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"],
    )
    return out

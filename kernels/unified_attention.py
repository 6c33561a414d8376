"""paged_unified_attention: decodes and prefill chunks of one step in one launch, with
every piece of metadata in device buffers of fixed capacity (after the design of vLLM
V1's Triton "unified attention"), so one CUDA graph per padded token count replays for
any mix of decodes and chunks.

Sequences b in [0, S): query tokens [qsl[b], qsl[b+1]) (a decode is a sequence of one
token), seq_lens[b] = KV positions visible to its last token (its new K/V already
stored). Unused sequence slots repeat the last qsl (no tokens); tokens past qsl[S]
(padding) belong to no sequence and their output rows are left unwritten.

Grid (T * GROUP // BLOCK_M + S, H_kv): capacities only, never values. Rows are packed
(token, head) pairs as in extend_attention.py. Sequence b owns the programs [P_b, P_b +
cdiv(n_b * GROUP, BLOCK_M)) with P_b = qsl[b] * GROUP // BLOCK_M + b: these ranges never
overlap and all lie below P_S <= grid, so a program finds its sequence by a binary search
over P (log2 S loads) and spare programs return at once. A decode is a chunk of one
token: its program runs the causal-diagonal loop of the extend kernel with GROUP rows.
No host sync, no .item(), no max_seqlen_q from the host.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import check_float, check_kv, dot_precision, next_pow2
from kernels.extend_attention import attend_chunk_rows
from kernels.extend_attention import default_config as extend_config

UNIFIED_ROWS = 64     # packed rows per program (tile height) for 16-bit inputs


@triton.jit
def _find_sequence(qsl_ptr, pid, num_seqs, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """The last sequence b whose first program P_b = qsl[b] * GROUP // BLOCK_M + b is
    at or before pid (P is non-decreasing in b, P_0 = 0)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(qsl_ptr + mid) * GROUP // BLOCK_M + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# num_seqs is a loop bound of the search: never a constexpr (a value of 1 would be)
@triton.jit(do_not_specialize=["num_seqs", "stride_btb"])
def _unified_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2,
    num_seqs,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btm,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PREC: tl.constexpr,
    FP8: tl.constexpr, DECODE_M: tl.constexpr, DECODE_N: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    b = _find_sequence(qsl_ptr, pid, num_seqs, GROUP, BLOCK_M)
    q_start = tl.load(qsl_ptr + b)
    n_q = tl.load(qsl_ptr + b + 1) - q_start
    row0 = (pid - (q_start * GROUP // BLOCK_M + b)) * BLOCK_M
    if row0 >= n_q * GROUP:
        return
    ctx = tl.load(lens_ptr + b)
    # a sequence whose rows fit the decode tile (a decode: GROUP rows) takes it
    if (DECODE_M != BLOCK_M or DECODE_N != BLOCK_N) and n_q * GROUP <= DECODE_M:
        attend_chunk_rows(
            q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2, b, kvh, q_start,
            n_q, ctx, row0,
            stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
            stride_vb, stride_vs, stride_vh, stride_vd, stride_btb, stride_btm,
            stride_ot, stride_oh, stride_od,
            GROUP, HEAD_DIM, BLOCK_D, DECODE_M, DECODE_N, PAGE, PREC, FP8)
    else:
        attend_chunk_rows(
            q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, scale_log2, b, kvh, q_start,
            n_q, ctx, row0,
            stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
            stride_vb, stride_vs, stride_vh, stride_vd, stride_btb, stride_btm,
            stride_ot, stride_oh, stride_od,
            GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PAGE, PREC, FP8)


def default_config(head_dim: int, dtype: torch.dtype, group: int) -> dict:
    """The tiles of every mix (a graph cannot pick tiles per step): a chunk's rows take
    the extend kernel's tile at UNIFIED_ROWS packed rows, a sequence whose rows fit one
    takes decode_m x decode_n (a decode's GROUP rows). At head_dim 128 a decode takes
    16 x 128 (its rows padded to 16, and half the KV tiles a context) and the chunks the
    extend kernel's 128 rows: 13-16 % off qwen3-0.6b's mixed step at W1's shape, 12-27 %
    off its decodes, 5-13 % off its chunks (docs/KERNELS.md). At head_dim 64 a second tile
    in the kernel slowed the chunks' programs more than it saved, so a decode keeps the
    extend tile there."""
    if head_dim == 128 and dtype != torch.float32 and group <= 16:
        cfg = extend_config(128, head_dim, dtype)
        cfg["decode_m"], cfg["decode_n"] = 16, 128
    else:
        cfg = extend_config(UNIFIED_ROWS, head_dim, dtype)
        cfg["decode_m"], cfg["decode_n"] = cfg["block_m"], cfg["block_n"]
    return cfg


def paged_unified_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, *,
                            k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None,
                            block_m: int | None = None, block_n: int | None = None,
                            decode_m: int | None = None, decode_n: int | None = None,
                            num_warps: int | None = None,
                            num_stages: int | None = None) -> torch.Tensor:
    """q [T, H, D] (T may include padding), query_start_loc [S+1] int32, seq_lens [S]
    int32, block_tables [S, M] int32 -> out [T, H, D] (rows past query_start_loc[S] are
    not written). An fp8 cache is read with k_scale, v_scale [H_kv] (None: unit). The
    tile knobs (decode_m x decode_n: a decode's tile) are for tests and sweeps."""
    check_float(q)
    ks, vs, fp8 = check_kv(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.shape[0] == num_seqs + 1 and block_tables.shape[0] >= num_seqs
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    cfg = default_config(head_dim, q.dtype, group)
    block_m, block_n = block_m or cfg["block_m"], block_n or cfg["block_n"]
    decode_m = min(decode_m or cfg["decode_m"], block_m)
    assert decode_m >= group or decode_m == block_m, (decode_m, group)
    grid = (num_tokens * group // block_m + num_seqs, num_kv_heads)
    _unified_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, ks, vs,
        scale * math.log2(math.e), num_seqs,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(),
        *out.stride(),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)),
        BLOCK_M=block_m, BLOCK_N=block_n, PAGE=k_cache.shape[1],
        PREC=dot_precision(q.dtype), FP8=fp8,
        DECODE_M=decode_m, DECODE_N=decode_n or cfg["decode_n"],
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"],
    )
    return out


def unified_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                                seq_lens: torch.Tensor, scale: float, *,
                                k_scale: torch.Tensor | None = None,
                                v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Torch oracle: the reference extend attention over the used sequences (a decode is
    a chunk of one token); padding rows come back as zeros."""
    from kernels import reference
    qsl = query_start_loc.to(torch.int64)
    used = int((qsl[1:] > qsl[:-1]).nonzero().max()) + 1 if (qsl[1:] > qsl[:-1]).any() else 0
    end = int(qsl[used]) if used else 0
    out = torch.zeros_like(q)
    if used:
        max_q = int((qsl[1:used + 1] - qsl[:used]).max())
        out[:end] = reference.paged_extend_attention(
            q[:end], k_cache, v_cache, block_tables[:used], query_start_loc[:used + 1],
            seq_lens[:used], max_q, scale, k_scale=k_scale, v_scale=v_scale)
    return out

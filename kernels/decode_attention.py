"""paged_decode_attention: split-K ("flash-decoding") attention of one query token per
sequence over its paged KV cache.

Phase 1, grid (B, H_kv, num_splits): program (b, kvh, s) takes the GROUP = H / H_kv query
heads that share KV head kvh as the M rows of tl.dot (padded to BLOCK_G >= 16 so GQA runs
on tensor cores and each K/V tile is read once per group, not once per head), and runs an
online softmax over KV positions [s * tokens_per_split, (s+1) * tokens_per_split) clipped
to context_lens[b], BLOCK_N tokens per step, each tile gathered through the block table.
It writes the partial (running max m, sum l, unnormalised acc) in fp32.

Merge (kernels/_split_merge.py): the last valid split program of each (b, kvh) to finish
merges the splits of its GROUP heads and writes the output: one launch, no reduce
kernel. With a single split, phase 1 normalises and writes the output itself.

Split sizes (docs/KERNELS.md "Splits sized by each context"): each sequence's context is
cut into num_splits ranges of max(ceil(ctx / num_splits) rounded up to BLOCK_N,
min_split_tokens) tokens, computed on the device from context_lens[b]. Sized by the
table width instead, a graph captured for max_model_len = 8192 gave every split 512
tokens at batch 16, 2048 at 64 and 4096 at 128, so a 600-token context ran on one or
two programs per KV head whatever num_splits was.

Early loads (rotary_decode_attention's path, docs/KERNELS.md "Early loads"): before the
PDL wait a program loads what the previous kernel does not write (its context length,
first tile's block-table entries and K/V rows, cos/sin, slot); only q and this step's
K/V wait. The position this launch stores is masked out of that tile and put in from
registers, so the result is bit-equal to the two-op path. Batch-1 graph replay 0.729 ->
0.693 ms (H100). Verify rows (rows_shared, docs/KERNELS.md "Verify rows in the fused
launch"): the positions a row's sequence stores in this launch (rows_before counts them
from the slots) come from those rows' keys and values, rotated in registers.

FP8 KV (kernels/kv_quant.py): tiles are loaded as e4m3 (half the bytes of bf16) and
take float16 dots (kernels/_attn_tile.py: K converted after its shared-memory load, V
widened from int16 pairs in registers so no byte-wide shared reads remain); the KV
head's K scale is folded into the score scale and its V scale into the output, so no
tile is ever multiplied by a scale.

Register cap: a launch whose (sequence, KV head) pairs fill the SMs compiles with
maxnreg = MAX_REGISTERS (four programs a multiprocessor instead of two or three).

CUDA-graph safety: the grid (num_splits) depends only on B, H_kv and block_tables.shape[1]
(never on context_lens values); programs whose range starts past context_lens[b] return
at once, and the merge derives the number of valid splits from context_lens on the
device. No host sync, no .item(). A sequence with context 0 yields 0.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._attn_tile import attend_tile, kv_rows, load_v, pv_step, softmax_step, widen_v
from kernels._common import (check_float, check_kv, dot_precision, next_pow2, num_sms,
                             zeroed_scratch)
from kernels._split_merge import merge_splits
from kernels.kv_quant import FP8_DTYPE
from kernels.pdl import pdl_enter
from kernels.reference import _rotary_then_decode
from kernels.rotary_kv import (attend_launch_tile, launch_rows_kv, rope_inputs, rope_store_new_kv,
                               rotary_store_kv, rows_before)

TARGET_PROGRAMS_PER_SM = 4      # at most this many phase-1 programs per multiprocessor
MIN_SPLIT_TOKENS = 128          # never split finer than this (by table width)
DYNAMIC_MIN_TOKENS = 64         # each context split into ranges of at least this many tokens
NUM_WARPS = 4
NUM_STAGES = 2
# Register cap (maxnreg) of a launch whose (sequence, KV head) pairs fill the SMs: the
# fused rotary launch takes 168 (bf16) / 208 (fp8) registers uncapped, 3 or 2 programs a
# multiprocessor; at 128 four fit (the spills sit in the prologue) and batch 64 and 256
# gain 15-27 %; at batch 1 the spills only add latency (5.8 -> 8.1 us a layer), so small
# batches keep the compiler's choice (docs/KERNELS.md "Register cap").
MAX_REGISTERS = 128
# A crowded fp8 launch (at least CROWDED_PAIRS_PER_SM (sequence, KV head) pairs a
# multiprocessor, head_dim >= 128) takes 2 warps and 32-token tiles: under the same cap
# twice the programs share a multiprocessor, so more serial tile chains overlap. qwen3-0.6b
# fp8 batch 256 (16 pairs an SM), H100: 156.2 -> 140.0 us a layer; at batch 64 (4 an SM)
# it lost (41.6 -> 50.2), and head_dim 64 (qwen2.5-0.5b) lost at every batch
# (docs/KERNELS.md "Crowded fp8 launches").
CROWDED_PAIRS_PER_SM = 8
CROWDED_FP8 = {"block_n": 32, "num_warps": 2}
# verify rows (rows_shared) take the fused launch up to this many (row, KV head) pairs
# (qwen2.5-0.5b, H200: 8-64 pairs gained, 128 lost; docs/KERNELS.md "Verify rows")
SHARED_MAX_PAIRS = 64
MAX_SPLITS = 256
MERGE_TILE = 8192               # fp32 partial elements a merge step loads (G x S x D)


@triton.jit
def _split_tokens(ctx, num_splits, min_split_tokens, BLOCK_N: tl.constexpr):
    """Tokens per split of a context of ctx tokens: its share of num_splits, whole tiles,
    at least min_split_tokens (a multiple of BLOCK_N)."""
    share = (ctx + num_splits * BLOCK_N - 1) // (num_splits * BLOCK_N) * BLOCK_N
    return tl.maximum(share, min_split_tokens)


# Ints that vary with the batch's longest context are not specialized on (value 1,
# divisible by 16): each distinct specialization is one more JIT compile mid-serving.
@triton.jit(do_not_specialize=["num_splits", "stride_btb", "min_split_tokens"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr,
    pos_ptr, nk_ptr, nv_ptr, cs_ptr, slot_ptr, ks_ptr, vs_ptr, order_ptr,
    scale_log2, min_split_tokens, num_heads, num_splits,
    stride_nkb, stride_nkh, stride_nvb, stride_nvh, stride_cs,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btm,
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, SINGLE: tl.constexpr, PREC: tl.constexpr,
    MERGE_G: tl.constexpr, MERGE_S: tl.constexpr,
    MERGE_ALL: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr,
    FP8: tl.constexpr, ORDERED: tl.constexpr = False, NUM_KV: tl.constexpr = 1,
    SHARED: tl.constexpr = False,
):
    if ORDERED:     # program p runs (order[p // NUM_KV], p % NUM_KV): longest first
        lin = tl.program_id(0) + tl.num_programs(0) * tl.program_id(1)
        b = tl.load(order_ptr + lin // NUM_KV)
        kvh = lin % NUM_KV
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    if not ROPE:
        pdl_enter(PDL)      # q and this step's K/V come from the previous kernel
    ctx = tl.load(ctx_ptr + b)
    tokens_per_split = _split_tokens(ctx, num_splits, min_split_tokens, BLOCK_N)
    start = split * tokens_per_split

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    b64 = b.to(tl.int64)
    out_mask = g_mask[:, None] & d_mask[None, :]
    if not SINGLE:
        if start >= ctx:
            if ctx <= 0:
                if split == 0:          # no valid split merges: context 0 yields zeros
                    if ROPE:
                        pdl_enter(PDL)
                    tl.store(out_ptr + b64 * stride_ob + heads[:, None] * stride_oh
                             + offs_d[None, :] * stride_od,
                             tl.zeros([BLOCK_G, BLOCK_D], tl.float32).to(
                                 out_ptr.dtype.element_ty), mask=out_mask)
            return
    end = tl.minimum(start + tokens_per_split, ctx)
    bt_row = bt_ptr + b64 * stride_btb
    k_head = k_ptr + kvh.to(tl.int64) * stride_kh
    v_head = v_ptr + kvh.to(tl.int64) * stride_vh
    q_rows = q_ptr + b64 * stride_qb + heads[:, None] * stride_qh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    ks, vs = 1.0, 1.0       # fp8: this KV head's scales (set at start, or calibrated)
    if FP8:
        ks = tl.load(ks_ptr + kvh)
        vs = tl.load(vs_ptr + kvh)
    qk_scale = scale_log2 * ks
    if ROPE:
        # Before the wait: everything but q and this step's K/V, which the previous
        # kernel writes. Only this kernel writes the cache, and the position it writes
        # now (ctx - 1, when slot >= 0) is left out of the early tile and put in from
        # registers below; the tables, lengths, positions and slots are host-filled.
        cos, sin, lo, partner, slot = rope_inputs(pos_ptr, cs_ptr, slot_ptr, b64, offs_d,
                                                   d_mask, stride_cs, HALF)
        tok = start + offs_n
        valid = tok < end
        if SHARED:      # [new_lo, ctx): positions this launch stores
            new_lo = ctx - (slot >= 0).to(tl.int32) \
                - rows_before(slot_ptr, bt_row, stride_btm, b64, ctx, slot, PAGE)
            new = valid & (tok >= new_lo)
        else:
            new = (tok == ctx - 1) & (slot >= 0)
        row_k, row_v = kv_rows(tok, valid, bt_row, stride_btm, stride_kb, stride_ks,
                               stride_vb, stride_vs, PAGE, True)
        early = valid & ~new
        k0 = tl.load(k_head + row_k[:, None] + offs_d[None, :] * stride_kd,
                     mask=early[:, None] & d_mask[None, :], other=0.0)
        v0 = load_v(v_head, row_v, early, offs_d, d_mask, stride_vd, HEAD_DIM, True)
        pdl_enter(PDL)
    q = tl.load(q_rows + offs_d[None, :] * stride_qd, mask=out_mask, other=0.0)
    first = start
    if ROPE:    # rotary_decode_attention: rotate q here; the last split stores K/V
        q, k_new, v_new = rope_store_new_kv(
            q, q_rows, b64, kvh, end == ctx, cos, sin, lo, partner, slot, offs_d, d_mask,
            g_mask, stride_qd, nk_ptr, nv_ptr, stride_nkb, stride_nkh, stride_nvb,
            stride_nvh, k_ptr, v_ptr, stride_kb, stride_ks, stride_kh, stride_kd, stride_vb,
            stride_vs, stride_vh, stride_vd, ks, vs, PAGE, FP8)
        # fold the early tile, the positions this launch stores from registers
        if SHARED:
            k_new, v_new = launch_rows_kv(
                tok, new, ctx, b64, kvh, offs_d, d_mask, lo, partner, cs_ptr, stride_cs,
                nk_ptr, nv_ptr, stride_nkb, stride_nkh, stride_nvb, stride_nvh, k_ptr, v_ptr,
                ks, vs, HALF, FP8)
            k0 = tl.where(new[:, None], k_new, k0)
            v0 = widen_v(v0)
            v0 = tl.where(new[:, None], v_new.to(v0.dtype), v0)
        else:
            k0 = tl.where(new[:, None], k_new[None, :], k0)
            v0 = widen_v(v0)
            v0 = tl.where(new[:, None], v_new.to(v0.dtype)[None, :], v0)
        m_i, alpha, p, l_i = softmax_step(q, m_i, l_i, k0, valid[None, :], qk_scale, PREC,
                                          True)
        acc = pv_step(acc, alpha, p, v0, q, PREC)
        first = start + BLOCK_N

    for n0 in range(first, end, BLOCK_N):
        tok = n0 + offs_n
        valid = tok < end
        if SHARED:      # (verify rows) a tile with positions other rows store this launch
            if n0 + BLOCK_N > new_lo:
                m_i, l_i, acc = attend_launch_tile(
                    q, m_i, l_i, acc, tok, valid, new_lo, ctx, b64, kvh, bt_row, k_head,
                    v_head, offs_d, d_mask, lo, partner, cs_ptr, stride_cs, nk_ptr, nv_ptr,
                    stride_nkb, stride_nkh, stride_nvb, stride_nvh, k_ptr, v_ptr, ks, vs,
                    stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
                    stride_vd, qk_scale, HEAD_DIM, PAGE, PREC, HALF, FP8)
            else:
                m_i, l_i, acc = attend_tile(
                    q, m_i, l_i, acc, tok, valid, valid[None, :], bt_row, k_head, v_head,
                    offs_d, d_mask, stride_btm, stride_kb, stride_ks, stride_kd, stride_vb,
                    stride_vs, stride_vd, qk_scale, HEAD_DIM, PAGE, PREC, True)
        else:
            m_i, l_i, acc = attend_tile(
                q, m_i, l_i, acc, tok, valid, valid[None, :], bt_row, k_head, v_head, offs_d,
                d_mask, stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
                stride_vd, qk_scale, HEAD_DIM, PAGE, PREC, True)

    if SINGLE:
        denom = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc * (vs / denom)[:, None]
        tl.store(out_ptr + b64 * stride_ob + heads[:, None] * stride_oh
                 + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = (b64 * num_heads + heads) * num_splits + split          # [BLOCK_G]
        tl.store(pm_ptr + part, m_i, mask=g_mask)
        tl.store(pl_ptr + part, l_i, mask=g_mask)
        tl.store(pacc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
        merge_splits(out_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr, b64, kvh, ctx,
                     tokens_per_split, num_heads, num_splits, offs_d, d_mask, vs, stride_ob,
                     stride_oh, stride_od, GROUP, HEAD_DIM, BLOCK_D, MERGE_G, MERGE_S,
                     MERGE_ALL)


def plan_splits(batch: int, num_kv_heads: int, max_blocks: int, page: int, block_n: int,
                sms: int) -> tuple[int, int]:
    """(num_splits, tokens_per_split) from shapes only, so a captured graph stays valid."""
    max_tokens = max(1, max_blocks * page)
    tiles = triton.cdiv(max_tokens, block_n)
    # floor, not ceil: a second, mostly empty wave of programs costs more than it gains
    want = (TARGET_PROGRAMS_PER_SM * sms) // max(1, batch * num_kv_heads)
    by_len = triton.cdiv(max_tokens, max(MIN_SPLIT_TOKENS, block_n))
    splits = max(1, min(want, by_len, MAX_SPLITS))
    tokens_per_split = triton.cdiv(tiles, splits) * block_n
    return triton.cdiv(max_tokens, tokens_per_split), tokens_per_split


def default_config(head_dim: int, dtype: torch.dtype, fp8: bool = False,
                   pairs_per_sm: float = 0.0) -> dict:
    """KV tile of BLOCK_N tokens per step, 4 warps, 2 stages (H100 sweep, docs/KERNELS.md):
    64 tokens beat 128 at batch >= 64 (72 vs 106 registers: more programs resident).
    float32 (exact FMA dots) takes fewer tokens at large head_dim; a crowded fp8 launch
    takes CROWDED_FP8."""
    if dtype == torch.float32:
        block_n = 64 if head_dim <= 64 else (32 if head_dim <= 128 else 16)
    else:
        block_n = 64 if head_dim <= 128 else 32
    cfg = {"block_n": block_n, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
    if fp8 and dtype != torch.float32 and head_dim >= 128 \
            and pairs_per_sm >= CROWDED_PAIRS_PER_SM:
        cfg.update(CROWDED_FP8)
    return cfg


def _two_launches(query: torch.Tensor, k_cache: torch.Tensor, rows_shared: bool = False) -> bool:
    """A 16-bit cache at head_dim >= 128 whose (sequence, KV head) pairs are more than
    TARGET_PROGRAMS_PER_SM a multiprocessor: rotary_store_kv and the plain decode beat
    the fused launch, whose rotary registers spill under the cap (qwen3-0.6b bf16, H200,
    2026-11-29, µs a layer fused / two: batch 64 46.3 / 47.0, 80 73.7 / 67.5, 256 169.7 /
    156.3; fp8 and head_dim 64 stay fused: docs/KERNELS.md "Two launches"). Verify rows
    (rows_shared) with more than SHARED_MAX_PAIRS (row, KV head) pairs: the two ops too."""
    pairs = query.shape[0] * k_cache.shape[2]
    if rows_shared and pairs > SHARED_MAX_PAIRS:
        return True
    return k_cache.dtype != FP8_DTYPE and query.dtype != torch.float32 \
        and query.shape[-1] >= 128 and pairs > TARGET_PROGRAMS_PER_SM * num_sms(query.device)


def rotary_decode_attention(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                            k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                            context_lens: torch.Tensor, scale: float,
                            rows_shared: bool = False, **knobs) -> torch.Tensor:
    """rotary_store_kv then paged_decode_attention in one launch (a decode-only step):
    each program rotates its query heads itself, and the split that covers a sequence's
    last position stores the rotated key and the value there before reading it.
    rows_shared (speculative decoding's verify rows: consecutive rows of one sequence in
    position order): a row also takes the positions its sequence's earlier rows store in
    this launch from their rotated keys and values in registers (rows_before,
    launch_rows_kv), never from the cache another program is writing. Neox rotary over
    the whole head only, and not a crowded 16-bit launch at head_dim >= 128
    (_two_launches); otherwise the two ops run one after the other (which stores every
    row before any attends)."""
    if not is_neox or cos_sin_cache.shape[-1] != query.shape[-1] or query.shape[0] == 0 \
            or _two_launches(query, k_cache, rows_shared):
        return _rotary_store_then_decode(
            positions, query, key, value, cos_sin_cache, is_neox, k_cache, v_cache,
            slot_mapping, block_tables, context_lens, scale, **knobs)
    check_float(query, key, value, cos_sin_cache)
    assert key.shape == value.shape and key.stride(-1) == 1 and value.stride(-1) == 1
    assert cos_sin_cache.stride(-1) == 1 and slot_mapping.shape[0] == query.shape[0]
    rope = (positions, key, value, cos_sin_cache, slot_mapping)
    return paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale,
                                  _rope=rope, _shared=rows_shared, **knobs)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, block_n: int | None = None,
                           num_warps: int | None = None, num_stages: int | None = None,
                           num_splits: int | None = None, order: torch.Tensor | None = None,
                           _rope: tuple | None = None, _shared: bool = False) -> torch.Tensor:
    """One query token per sequence. q [B, H, D] -> out [B, H, D] (q.dtype). An fp8
    cache is read with its per-head scales (k_scale, v_scale [H_kv]; None: unit).

    order [B] int32 (decode_order): the sequences longest context first; program p then
    runs sequence order[p // H_kv], KV head p % H_kv, so the longest chains start first
    and no long sequence is left for the tail of the launch (longest-processing-time
    first). The other keyword-only knobs exist for the tests and the benchmark sweep;
    callers leave them unset. _rope: (positions, key, value, cos_sin_cache, slot_mapping) from
    rotary_decode_attention, and _shared its rows_shared.
    """
    check_float(q)
    ks, vs, fp8 = check_kv(k_cache, v_cache, k_scale, v_scale)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    page = k_cache.shape[1]
    sms = num_sms(q.device)
    cfg = default_config(head_dim, q.dtype, fp8, batch * num_kv_heads / sms)
    block_n = block_n or cfg["block_n"]
    num_warps = num_warps or cfg["num_warps"]
    num_stages = num_stages or cfg["num_stages"]
    splits, tokens_per_split = plan_splits(batch, num_kv_heads, block_tables.shape[1], page,
                                           block_n, sms)
    if num_splits is not None:
        tiles = triton.cdiv(max(1, block_tables.shape[1] * page), block_n)
        tokens_per_split = triton.cdiv(tiles, num_splits) * block_n
        splits = triton.cdiv(tiles * block_n, tokens_per_split)
    min_tokens = triton.cdiv(DYNAMIC_MIN_TOKENS, block_n) * block_n
    single = splits == 1
    block_d = max(16, next_pow2(head_dim))
    block_g = max(16, next_pow2(group))
    merge_g = max(2, next_pow2(group))
    if single:
        cnt = pm = pl = pacc = out  # unused
    else:
        cnt = zeroed_scratch(q.device, "decode_counters", batch * num_kv_heads, torch.int32)
        pm = torch.empty((batch, num_heads, splits), dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
        pacc = torch.empty((batch, num_heads, splits, head_dim), dtype=torch.float32,
                           device=q.device)
    pos, nk, nv, cs, slots = _rope if _rope is not None else (q, q, q, q, q)
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, pm, pl, pacc, cnt,
        pos, nk, nv, cs, slots, ks, vs, order if order is not None else q,
        scale * math.log2(math.e), min_tokens, num_heads, splits,
        nk.stride(0), nk.stride(1), nv.stride(0), nv.stride(1), cs.stride(0),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(),
        *out.stride(),
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=block_n, PAGE=page, SINGLE=single, PREC=dot_precision(q.dtype),
        MERGE_G=merge_g,
        MERGE_S=max(2, min(64, MERGE_TILE // (merge_g * block_d))),
        MERGE_ALL=max(16, next_pow2(splits)), ROPE=_rope is not None, HALF=head_dim // 2,
        FP8=fp8, ORDERED=order is not None, NUM_KV=num_kv_heads, SHARED=_shared,
        num_warps=num_warps, num_stages=num_stages, **pdl.launch_args(q.device),
        **({"maxnreg": MAX_REGISTERS}
           if MAX_REGISTERS and batch * num_kv_heads >= sms else {}),
    )
    return out


# the two-op path of rotary_decode_attention: the reference composition of this backend's ops
_rotary_store_then_decode = _rotary_then_decode(rotary_store_kv, paged_decode_attention)

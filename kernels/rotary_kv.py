"""rotary_store_kv: rotary embedding of q and k fused with the paged KV-cache store.

Grid (T,): program t reads the cos | sin row of positions[t] once, writes the rotated
query heads of token t to a new tensor (as rotary_embedding does), and, unless
slot_mapping[t] is -1, writes the rotated key heads and the value heads straight into
their cache slot (block = slot // block_size, offset = slot % block_size). The rotated
key is never written anywhere else. One launch instead of two, and the key makes one
trip through registers instead of two through memory.

Rounding matches the reference (rotary_embedding, then store_kv_cache): the rotated key
is rounded to the key's dtype and then cast to the cache dtype (an fp8 cache: divided by
its head's scale and saturated first, kv_store.to_cache). Dims past rot_dim are
copied; is_neox pairs (i, i + rot/2), otherwise (2i, 2i + 1). Inputs are never modified.

rope_inputs and rope_store_new_kv are the same work inside decode attention's fused
path (kernels/decode_attention.py, rotary_decode_attention): a program's query heads,
and the one new key and value it stores.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._attn_tile import kv_rows, load_v, pv_step, softmax_step, widen_v
from kernels._common import check_float, check_kv, next_pow2
from kernels.kv_store import to_cache
from kernels.pdl import pdl_enter
from kernels.rotary import (_cos_sin, _last_dim_contiguous, _pair_index, _rotate_heads,
                            rotate_pair, rotate_tile)


@triton.jit
def _rotary_store_kv_kernel(
    pos_ptr, q_ptr, k_ptr, v_ptr, cs_ptr, q_out_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_vd,
    stride_cs, stride_oqt, stride_oqh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_Q: tl.constexpr, NUM_K: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_NEOX: tl.constexpr, PDL: tl.constexpr, FP8: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pdl_enter(PDL)
    cos, sin, offs_r, r_mask = _cos_sin(cs_ptr, pos_ptr, t, stride_cs, HALF, BLOCK_R)
    _rotate_heads(q_ptr, q_out_ptr, t, cos, sin, stride_qt, stride_qh, stride_oqt,
                  stride_oqh, NUM_Q, HEAD_DIM, HALF, BLOCK_H, BLOCK_R, BLOCK_P, IS_NEOX)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        # key: rotate, round to the key dtype, cast to the cache dtype
        offs_h = tl.arange(0, BLOCK_KH)[:, None]
        h_mask = offs_h < NUM_K
        mask = h_mask & r_mask
        ks, vs = 1.0, 1.0
        if FP8:
            ks = tl.load(ks_ptr + offs_h, mask=h_mask, other=1.0)
            vs = tl.load(vs_ptr + offs_h, mask=h_mask, other=1.0)
        i1, i2 = _pair_index(offs_r, HALF, IS_NEOX)
        src = k_ptr + t * stride_kt + offs_h * stride_kh
        dst = kc_ptr + blk * stride_kcb + off * stride_kcs + offs_h * stride_kch
        k_ty = k_ptr.dtype.element_ty
        x1 = tl.load(src + i1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + i2, mask=mask, other=0.0).to(tl.float32)
        r1, r2 = rotate_pair(x1, x2, cos, sin)
        tl.store(dst + i1, to_cache(r1.to(k_ty), ks, kc_ptr, FP8), mask=mask)
        tl.store(dst + i2, to_cache(r2.to(k_ty), ks, kc_ptr, FP8), mask=mask)
        if BLOCK_P > 0:
            offs_p = 2 * HALF + tl.arange(0, BLOCK_P)[None, :]
            p_mask = h_mask & (offs_p < HEAD_DIM)
            tl.store(dst + offs_p, to_cache(tl.load(src + offs_p, mask=p_mask), ks, kc_ptr,
                                            FP8), mask=p_mask)
        # value: plain copy with a cast
        offs_d = tl.arange(0, BLOCK_D)[None, :]
        v_mask = h_mask & (offs_d < HEAD_DIM)
        v = tl.load(v_ptr + t * stride_vt + offs_h * stride_vh + offs_d * stride_vd,
                    mask=v_mask)
        tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + offs_h * stride_vch
                 + offs_d * stride_vcd, to_cache(v, vs, vc_ptr, FP8), mask=v_mask)


def rotary_store_kv(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate query [T, H, D] and key [T, H_kv, D]; store the rotated key and value [T, H_kv,
    D] at slot_mapping [T] (-1: skip) in the paged caches (fp8: k_scale, v_scale [H_kv]);
    return the rotated query."""
    check_float(query, key, value, cos_sin_cache)
    ks, vs, fp8 = check_kv(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_q, head_dim = query.shape
    num_k = key.shape[1]
    rot_dim = cos_sin_cache.shape[-1]
    assert rot_dim % 2 == 0 and rot_dim <= head_dim, (rot_dim, head_dim)
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape and tuple(k_cache.shape[2:]) == (num_k, head_dim)
    assert slot_mapping.shape[0] == num_tokens
    half = rot_dim // 2
    query, key = _last_dim_contiguous(query), _last_dim_contiguous(key)
    cos_sin_cache = _last_dim_contiguous(cos_sin_cache)
    if k_cache.stride(-1) != 1:
        raise ValueError("k_cache needs a unit last-dim stride")
    q_out = torch.empty((num_tokens, num_q, head_dim), dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return q_out
    block_h = next_pow2(max(num_q, num_k))
    block_r = next_pow2(half)
    block_p = next_pow2(head_dim - rot_dim) if head_dim > rot_dim else 0
    _rotary_store_kv_kernel[(num_tokens,)](
        positions, query, key, value, cos_sin_cache, q_out, k_cache, v_cache, slot_mapping,
        ks, vs, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), value.stride(2),
        cos_sin_cache.stride(0), q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        NUM_Q=num_q, NUM_K=num_k, HEAD_DIM=head_dim, HALF=half, PAGE=k_cache.shape[1],
        BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_P=block_p, BLOCK_KH=next_pow2(num_k),
        BLOCK_D=next_pow2(head_dim), IS_NEOX=bool(is_neox), FP8=fp8,
        num_warps=max(1, min(8, block_h * block_r // 256)), **pdl.launch_args(query.device),
    )
    return q_out


# -- pieces of kernels/decode_attention.py's fused rotary path ------------------------
@triton.jit
def rope_inputs(pos_ptr, cs_ptr, slot_ptr, b64, offs_d, d_mask, stride_cs,
                 HALF: tl.constexpr):
    """What rotating this row needs besides q, k, v: (cos, sin, lower-half mask, partner
    lane, slot). Host-filled inputs, not the previous kernel's: readable before the wait."""
    pos = tl.load(pos_ptr + b64).to(tl.int64)
    lo = offs_d < HALF
    half_i = tl.where(lo, offs_d, offs_d - HALF)
    partner = tl.where(lo, offs_d + HALF, offs_d - HALF)
    cs_row = cs_ptr + pos * stride_cs
    cos = tl.load(cs_row + half_i, mask=d_mask, other=1.0)
    sin = tl.load(cs_row + HALF + half_i, mask=d_mask, other=0.0)
    slot = tl.load(slot_ptr + b64).to(tl.int64)
    return cos, sin, lo, partner, slot


@triton.jit
def rope_store_new_kv(q, q_rows, b64, kvh, last, cos, sin, lo, partner, slot, offs_d, d_mask,
                   g_mask, stride_qd, nk_ptr, nv_ptr, stride_nkb, stride_nkh, stride_nvb,
                   stride_nvh, k_ptr, v_ptr, stride_kb, stride_ks, stride_kh, stride_kd,
                   stride_vb, stride_vs, stride_vh, stride_vd, ks, vs, PAGE: tl.constexpr,
                   FP8: tl.constexpr):
    """(rotated query tile rounded to q's dtype, as rotary_store_kv writes it; this step's
    rotated key and value in the cache's dtype, fp8: with the head's scales ks, vs). The split that covers the context's last
    position (`last`) stores the key and value in their slot, then a barrier makes them
    visible to the whole program, which is the only one to read that position."""
    qp = tl.load(q_rows + partner[None, :] * stride_qd,
                 mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q_rot = rotate_tile(q.to(tl.float32), qp.to(tl.float32), cos[None, :], sin[None, :],
                        lo[None, :]).to(q.dtype)
    k_row = nk_ptr + b64 * stride_nkb + kvh * stride_nkh
    k = tl.load(k_row + offs_d, mask=d_mask, other=0.0)
    kp = tl.load(k_row + partner, mask=d_mask, other=0.0)
    k_new = rotate_tile(k.to(tl.float32), kp.to(tl.float32), cos, sin, lo).to(k.dtype)
    k_new = to_cache(k_new, ks, k_ptr, FP8)
    v_new = to_cache(tl.load(nv_ptr + b64 * stride_nvb + kvh * stride_nvh + offs_d,
                             mask=d_mask), vs, v_ptr, FP8)
    if last & (slot >= 0):
        blk, off = slot // PAGE, slot % PAGE
        tl.store(k_ptr + blk * stride_kb + off * stride_ks + kvh * stride_kh
                 + offs_d * stride_kd, k_new, mask=d_mask)
        tl.store(v_ptr + blk * stride_vb + off * stride_vs + kvh * stride_vh
                 + offs_d * stride_vd, v_new, mask=d_mask)
        tl.debug_barrier()
    return q_rot, k_new, v_new


# -- decode rows of one sequence in one launch (speculative decoding's verify rows) ----
@triton.jit
def rows_before(slot_ptr, bt_row, stride_btm, b64, ctx, slot, PAGE: tl.constexpr):
    """How many rows just before row b64 store into its own context this launch: its
    sequence's earlier verified positions (row b - i stores position ctx - 1 - i into a
    block of this row's table). A slot names one block's one position, and only the
    request that owns a block alone writes it, so no other sequence's row matches.
    Host-filled inputs only: readable before the PDL wait."""
    back = tl.full([], 0, tl.int32)
    go = slot >= 0
    while go:
        r = b64 - back - 1
        p = ctx - 2 - back
        ok = (r >= 0) & (p >= 0)
        s_r = tl.load(slot_ptr + r, mask=ok, other=-1).to(tl.int64)
        blk = tl.load(bt_row + (p // PAGE) * stride_btm, mask=ok, other=0).to(tl.int64)
        go = ok & (s_r >= 0) & (s_r == blk * PAGE + p % PAGE)
        back += go.to(tl.int32)
    return back


@triton.jit
def launch_rows_kv(tok, new, ctx, b64, kvh, offs_d, d_mask, lo, partner, cs_ptr, stride_cs,
                   nk_ptr, nv_ptr, stride_nkb, stride_nkh, stride_nvb, stride_nvh,
                   k_ptr, v_ptr, ks, vs, HALF: tl.constexpr, FP8: tl.constexpr):
    """The key and value tiles [N, D] (cache dtype) of the positions `tok` marked `new`,
    which rows of this launch store: position p is row b - (ctx - 1 - p), its sequence's
    decode rows being consecutive and in position order. Rotated and rounded as
    rotary_store_kv stores them, so a tile that takes them is bit-equal to one read after
    the store."""
    row = b64 - (ctx - 1 - tok).to(tl.int64)
    m = new[:, None] & d_mask[None, :]
    half_i = tl.where(lo, offs_d, offs_d - HALF)
    cs_row = cs_ptr + tok.to(tl.int64)[:, None] * stride_cs
    cos = tl.load(cs_row + half_i[None, :], mask=m, other=1.0)
    sin = tl.load(cs_row + HALF + half_i[None, :], mask=m, other=0.0)
    k_rows = nk_ptr + row[:, None] * stride_nkb + kvh * stride_nkh
    k = tl.load(k_rows + offs_d[None, :], mask=m, other=0.0)
    kp = tl.load(k_rows + partner[None, :], mask=m, other=0.0)
    k_rot = rotate_tile(k.to(tl.float32), kp.to(tl.float32), cos, sin, lo[None, :]).to(k.dtype)
    v = tl.load(nv_ptr + row[:, None] * stride_nvb + kvh * stride_nvh + offs_d[None, :],
                mask=m, other=0.0)
    return to_cache(k_rot, ks, k_ptr, FP8), to_cache(v, vs, v_ptr, FP8)


@triton.jit
def attend_launch_tile(q, m_i, l_i, acc, tok, valid, new_lo, ctx, b64, kvh, bt_row, k_head,
                       v_head, offs_d, d_mask, lo, partner, cs_ptr, stride_cs, nk_ptr, nv_ptr,
                       stride_nkb, stride_nkh, stride_nvb, stride_nvh, k_ptr, v_ptr, ks, vs,
                       stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
                       stride_vd, scale_log2, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                       PREC: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr):
    """attend_tile of a tile whose positions from new_lo on are stored by this launch's
    rows: those come from launch_rows_kv, the others from the cache (the same values and
    the same folding as attend_tile after the store)."""
    new = valid & (tok >= new_lo)
    cached = valid & ~new
    row_k, row_v = kv_rows(tok, cached, bt_row, stride_btm, stride_kb, stride_ks, stride_vb,
                           stride_vs, PAGE, True)
    k = tl.load(k_head + row_k[:, None] + offs_d[None, :] * stride_kd,
                mask=cached[:, None] & d_mask[None, :], other=0.0)
    v = widen_v(load_v(v_head, row_v, cached, offs_d, d_mask, stride_vd, HEAD_DIM, True))
    k_new, v_new = launch_rows_kv(tok, new, ctx, b64, kvh, offs_d, d_mask, lo, partner,
                                  cs_ptr, stride_cs, nk_ptr, nv_ptr, stride_nkb, stride_nkh,
                                  stride_nvb, stride_nvh, k_ptr, v_ptr, ks, vs, HALF, FP8)
    k = tl.where(new[:, None], k_new, k)
    v = tl.where(new[:, None], v_new.to(v.dtype), v)
    m_new, alpha, p, l_i = softmax_step(q, m_i, l_i, k, valid[None, :], scale_log2, PREC, True)
    return m_new, l_i, pv_step(acc, alpha, p, v, q, PREC)

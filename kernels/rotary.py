"""rotary_embedding: rotate the first rot_dim dims of every query and key head.

Grid (T,): program t reads cos/sin for positions[t] once (cos_sin_cache row: cos in the
first half, sin in the second) and writes rotated copies of all H query heads and H_kv key
heads of token t, as [BLOCK_H, rot_dim / 2] tiles. is_neox pairs dim i with i + rot/2
(Llama/HF); otherwise dims 2i and 2i+1 (GPT-J). Dims past rot_dim are copied unchanged.
Math in fp32, result rounded to the input dtype; inputs are never modified.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_float, next_pow2


@triton.jit
def _pair_index(offs_r, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Columns of the two halves each rotation mixes: (r, r + HALF) in NeoX style, else
    the interleaved (2r, 2r + 1)."""
    if IS_NEOX:
        i1 = offs_r
        i2 = offs_r + HALF
    else:
        i1 = offs_r * 2
        i2 = offs_r * 2 + 1
    return i1, i2


@triton.jit
def rotate_pair(x1, x2, cos, sin):
    """(x1 cos - x2 sin, x2 cos + x1 sin) in fp32 with the roundings pinned by explicit
    FMAs: every kernel that rotates (rotary_embedding, rotary_store_kv, the fused decode
    attention) gets bit-identical results, whatever the compiler would contract."""
    return tl.fma(x1, cos, -(x2 * sin)), tl.fma(x2, cos, x1 * sin)


@triton.jit
def rotate_tile(x, partner, cos, sin, lo):
    """rotate_pair on a whole-head tile (Neox): x (fp32) holds both halves, `partner`
    each dim's partner d +- HALF, lo marks the low half; the same two roundings."""
    return tl.fma(x, cos, tl.where(lo, -(partner * sin), partner * sin))


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, t, cos, sin, stride_st, stride_sh, stride_dt,
                  stride_dh, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_P: tl.constexpr, IS_NEOX: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_r = tl.arange(0, BLOCK_R)[None, :]
    mask = (offs_h < NUM_HEADS) & (offs_r < HALF)
    src = src_ptr + t * stride_st + offs_h * stride_sh
    dst = dst_ptr + t * stride_dt + offs_h * stride_dh
    i1, i2 = _pair_index(offs_r, HALF, IS_NEOX)
    x1 = tl.load(src + i1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + i2, mask=mask, other=0.0).to(tl.float32)
    ty = dst_ptr.dtype.element_ty
    r1, r2 = rotate_pair(x1, x2, cos, sin)
    tl.store(dst + i1, r1.to(ty), mask=mask)
    tl.store(dst + i2, r2.to(ty), mask=mask)
    if BLOCK_P > 0:
        offs_p = 2 * HALF + tl.arange(0, BLOCK_P)[None, :]
        p_mask = (offs_h < NUM_HEADS) & (offs_p < HEAD_DIM)
        tl.store(dst + offs_p, tl.load(src + offs_p, mask=p_mask), mask=p_mask)


@triton.jit
def _cos_sin(cs_ptr, pos_ptr, t, stride_cs, HALF: tl.constexpr, BLOCK_R: tl.constexpr):
    """cos and sin at token t's position as [1, BLOCK_R] fp32 rows (zero past HALF), with
    the column offsets and mask they were loaded with."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)[None, :]
    r_mask = offs_r < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + offs_r, mask=r_mask,
                  other=0.0).to(tl.float32)
    return cos, sin, offs_r, r_mask


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cs_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    stride_oqt, stride_oqh, stride_okt, stride_okh,
    NUM_Q: tl.constexpr, NUM_K: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cos, sin, offs_r, r_mask = _cos_sin(cs_ptr, pos_ptr, t, stride_cs, HALF, BLOCK_R)
    _rotate_heads(q_ptr, q_out_ptr, t, cos, sin, stride_qt, stride_qh, stride_oqt,
                  stride_oqh, NUM_Q, HEAD_DIM, HALF, BLOCK_H, BLOCK_R, BLOCK_P, IS_NEOX)
    _rotate_heads(k_ptr, k_out_ptr, t, cos, sin, stride_kt, stride_kh, stride_okt,
                  stride_okh, NUM_K, HEAD_DIM, HALF, BLOCK_H, BLOCK_R, BLOCK_P, IS_NEOX)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool = True):
    """Apply rotary embedding. query [T, H, D], key [T, H_kv, D]; returns new (q, k)."""
    check_float(query, key, cos_sin_cache)
    num_tokens, num_q, head_dim = query.shape
    num_k = key.shape[1]
    rot_dim = cos_sin_cache.shape[-1]
    assert rot_dim % 2 == 0 and rot_dim <= head_dim, (rot_dim, head_dim)
    half = rot_dim // 2
    query, key = _last_dim_contiguous(query), _last_dim_contiguous(key)
    cos_sin_cache = _last_dim_contiguous(cos_sin_cache)
    q_out = torch.empty((num_tokens, num_q, head_dim), dtype=query.dtype, device=query.device)
    k_out = torch.empty((num_tokens, num_k, head_dim), dtype=key.dtype, device=key.device)
    if num_tokens == 0:
        return q_out, k_out
    block_h = next_pow2(max(num_q, num_k))
    block_r = next_pow2(half)
    block_p = next_pow2(head_dim - rot_dim) if head_dim > rot_dim else 0
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache, q_out, k_out,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        cos_sin_cache.stride(0),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        NUM_Q=num_q, NUM_K=num_k, HEAD_DIM=head_dim, HALF=half,
        BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_P=block_p, IS_NEOX=bool(is_neox),
        num_warps=max(1, min(8, block_h * block_r // 256)),
    )
    return q_out, k_out

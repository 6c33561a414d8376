"""store_kv_cache: scatter new K/V rows into the paged caches, one launch for both.

Grid (T,): program t copies token t's [H_kv, D] key and value tiles to slot
slot_mapping[t] (block = slot // block_size, offset = slot % block_size) and returns at
once for slot -1. Every stride is passed, so key/value may be views of a fused qkv
projection and the caches may be slices of a larger allocation; a unit last-dim stride
is specialised by Triton into wide vector accesses. An fp8 cache stores each head's
values divided by its scale, saturated to ±448 (to_cache, shared with the rotary
stores; kernels/kv_quant.py is the torch side of the same rule).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_float, check_kv, next_pow2
from kernels.kv_quant import FP8_MAX

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def to_cache(x, scale, cache_ptr, FP8: tl.constexpr):
    """x as cache_ptr's cache stores it: a cast, or for fp8 x / scale (correctly
    rounded, in float32) saturated to the largest finite e4m3 value, then rounded."""
    if FP8:
        x = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale), -_FP8_MAX, _FP8_MAX)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    t64 = t.to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    h_mask = offs_h < NUM_HEADS
    mask = h_mask & (offs_d < HEAD_DIM)
    ks, vs = 1.0, 1.0
    if FP8:
        ks = tl.load(ks_ptr + offs_h, mask=h_mask, other=1.0)
        vs = tl.load(vs_ptr + offs_h, mask=h_mask, other=1.0)

    k = tl.load(key_ptr + t64 * stride_kt + offs_h * stride_kh + offs_d * stride_kd,
                mask=mask)
    k_dst = k_cache_ptr + blk * stride_kcb + off * stride_kcs
    tl.store(k_dst + offs_h * stride_kch + offs_d * stride_kcd,
             to_cache(k, ks, k_cache_ptr, FP8), mask=mask)

    v = tl.load(value_ptr + t64 * stride_vt + offs_h * stride_vh + offs_d * stride_vd,
                mask=mask)
    v_dst = v_cache_ptr + blk * stride_vcb + off * stride_vcs
    tl.store(v_dst + offs_h * stride_vch + offs_d * stride_vcd,
             to_cache(v, vs, v_cache_ptr, FP8), mask=mask)


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                   k_scale: torch.Tensor | None = None,
                   v_scale: torch.Tensor | None = None) -> None:
    """Write key/value [T, H_kv, D] into the paged caches at slot_mapping [T] (in place);
    an fp8 cache holds value / scale per head (k_scale, v_scale [H_kv]; None: unit)."""
    check_float(key, value)
    ks, vs, fp8 = check_kv(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == key.shape[1:]
    assert slot_mapping.shape[0] == num_tokens
    block_h, block_d = next_pow2(num_heads), next_pow2(head_dim)
    warps = max(1, min(8, block_h * block_d // 256))
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, ks, vs,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=block_h, BLOCK_D=block_d, FP8=fp8,
        num_warps=warps,
    )

"""store_kv_cache: scatter new K/V rows into the paged caches, one launch for both.

Grid (T,): program t copies token t's [H_kv, D] key and value tiles to slot
slot_mapping[t] (block = slot // block_size, offset = slot % block_size) and returns at
once for slot -1. Every stride is passed, so key/value may be views of a fused qkv
projection and the caches may be slices of a larger allocation; a unit last-dim stride
is specialised by Triton into wide vector accesses.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_float, next_pow2


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
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
    mask = (offs_h < NUM_HEADS) & (offs_d < HEAD_DIM)

    k = tl.load(key_ptr + t64 * stride_kt + offs_h * stride_kh + offs_d * stride_kd,
                mask=mask)
    k_dst = k_cache_ptr + blk * stride_kcb + off * stride_kcs
    tl.store(k_dst + offs_h * stride_kch + offs_d * stride_kcd,
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)

    v = tl.load(value_ptr + t64 * stride_vt + offs_h * stride_vh + offs_d * stride_vd,
                mask=mask)
    v_dst = v_cache_ptr + blk * stride_vcb + off * stride_vcs
    tl.store(v_dst + offs_h * stride_vch + offs_d * stride_vcd,
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, H_kv, D] into the paged caches at slot_mapping [T] (in place)."""
    check_float(key, value, k_cache, v_cache)
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == key.shape[1:]
    assert slot_mapping.shape[0] == num_tokens
    block_h, block_d = next_pow2(num_heads), next_pow2(head_dim)
    warps = max(1, min(8, block_h * block_d // 256))
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=warps,
    )

"""The CPU backend's rotary embedding and KV store: reference.rotary_store_kv in a
third of the torch ops.

Why: on one CPU thread a decode step of the bundled model is bound by per-op cost as
much as by arithmetic (6 layers x ~100 small ops). The reference upcasts, chunks and
concatenates q and k separately and stores through a boolean mask (a host sync per
layer). Here, in float32 with rotate-half (Llama) rotary over the whole head: q and k,
adjacent columns of the fused qkv projection, rotate as one tensor (written straight
into halves of one output, no cat), and the store is two index_copy_ with no mask when
no slot is -1 (an fp8 cache: the reference's store, which quantizes). Anything else runs
the reference. Same semantics (tests/kernels/test_cpu_ops.py).
"""
from __future__ import annotations

import torch

from kernels import reference as ref
from kernels.kv_quant import FP8_DTYPE


def _fast(query, key, value, cos_sin_cache, is_neox, k_cache) -> bool:
    return (is_neox and cos_sin_cache.shape[-1] == query.shape[-1]
            and query.dtype == key.dtype == value.dtype == torch.float32
            and k_cache.dtype in (torch.float32, FP8_DTYPE)
            and cos_sin_cache.dtype == torch.float32 and query.shape[-1] % 2 == 0)


def _joined(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """query [T, H, D] and key [T, H_kv, D] as one [T, H + H_kv, D] view when key's heads
    follow query's in memory (split views of one qkv row), else None."""
    if (query.untyped_storage().data_ptr() != key.untyped_storage().data_ptr()
            or query.stride() != key.stride() or query.stride(-1) != 1
            or query.stride(1) != query.shape[2]
            or key.data_ptr() != query.data_ptr() + query.shape[1] * query.stride(1)
            * query.element_size()):
        return None
    shape = (query.shape[0], query.shape[1] + key.shape[1], query.shape[2])
    return query.as_strided(shape, query.stride())


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[x1*cos - x2*sin, x2*cos + x1*sin] into a new [T, H, D] tensor; cos/sin [T, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype)
    lo, hi = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=lo).addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=hi).addcmul_(x1, sin)
    return out


def rotary_store_kv(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """As reference.rotary_store_kv: rotates query and key, stores the rotated key and
    the value at slot_mapping (in place), returns the rotated query (a new tensor)."""
    if not _fast(query, key, value, cos_sin_cache, is_neox, k_cache):
        return ref.rotary_store_kv(positions, query, key, value, cos_sin_cache, is_neox,
                                   k_cache, v_cache, slot_mapping, k_scale=k_scale,
                                   v_scale=v_scale)
    cos_sin = cos_sin_cache.index_select(0, positions.long())[:, None, :]
    half = query.shape[-1] // 2
    cos, sin = cos_sin[..., :half], cos_sin[..., half:]
    joined = _joined(query, key)
    if joined is None:
        q, k = _rotate_half(query, cos, sin), _rotate_half(key, cos, sin)
    else:
        both = _rotate_half(joined, cos, sin)
        q, k = both[:, :query.shape[1]], both[:, query.shape[1]:]
    slots = slot_mapping.long()
    # an fp8 cache (it quantizes) or padding rows (its mask): the reference's store
    if k_cache.dtype == FP8_DTYPE or (slots.numel() and int(slots.min()) < 0):
        ref.store_kv_cache(k, value, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    else:
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value)
    return q

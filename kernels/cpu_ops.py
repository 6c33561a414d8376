"""The CPU backend ("torch_sdpa", as vLLM's CPU attention backend): paged attention
here, as one batched `scaled_dot_product_attention` per layer (torch's fused CPU flash
kernel); linears, RMSNorm and SiLU-mul from kernels/cpu_linear.py (oneDNN on packed
weights), rotary + KV store from kernels/cpu_rotary.py, the rest from
kernels/reference.py.

Why: the reference gathers each sequence's K/V with advanced indexing, casts it to
float32 and runs an einsum that copies K/V again into head-major layout (extend: one
Python iteration per sequence). Here each layer copies only whole KV blocks (one
`index_select` of contiguous block rows for K and one for V) and hands SDPA strided
views of them: no cast (the cache dtype is kept; SDPA accumulates in float32), no
layout copy, no per-sequence loop. Decode is the same call as extend with one query
per sequence. Same signatures and semantics as the reference (tests/kernels/test_cpu_ops.py);
not CUDA-graph-safe (it reads the longest context on the host). An fp8 cache's gathered
blocks are dequantized (codes times their head's scale) into the query's dtype before
SDPA, which takes no fp8: on the CPU the pool's bytes shrink, the gather copies a
quarter of float32's, and the attention itself runs as before.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from kernels.cpu_linear import (linear, rms_norm, rms_norm_linear, silu_and_mul,  # noqa: F401
                                silu_mul_linear)
from kernels.cpu_rotary import rotary_store_kv  # noqa: F401
from kernels.kv_quant import dequantize
from kernels.reference import (_rotary_then_decode, argmax, rotary_embedding,  # noqa: F401
                               store_kv_cache, top_logprobs)

_local = threading.local()      # each engine thread's last plans (decode, extend)


class _Plan:
    """What every layer of one step shares: the blocks to gather, the mask, the padded
    rows of an extend's tokens, and the gather buffers (reused layer after layer)."""

    def __init__(self, block_tables, context_lens, cu_seqlens_q, n_q: int, group: int,
                 block_size: int):
        batch = block_tables.shape[0]
        lens = context_lens.to(torch.int64)
        num_new, self.rows = 1, None            # decode: one query per sequence
        if cu_seqlens_q is not None:            # extend: row of each token when padded
            cu = cu_seqlens_q.to(torch.int64)
            num_new = cu[1:] - cu[:-1]
            seq = torch.repeat_interleave(torch.arange(batch), num_new)
            self.rows = seq * n_q + torch.arange(int(cu[-1])) - cu[:-1].index_select(0, seq)
        self.n_blocks = max(1, -(-int(lens.max()) // block_size))
        self.blocks = block_tables[:, :self.n_blocks].reshape(-1).to(torch.int64)
        span = torch.arange(self.n_blocks * block_size)
        q_pos = (lens - num_new)[:, None] + torch.arange(n_q)[None, :]   # [B, Q] positions
        visible = (span[None, None, :] <= q_pos[:, :, None]) & (span < lens[:, None, None])
        # the `group` query heads of one KV head are `group` rows of the same mask
        self.mask = visible[:, None].expand(batch, group, n_q, -1).reshape(
            batch, 1, group * n_q, -1)
        self.has_empty_rows = not bool(visible.any(-1).all())   # their output: NaN -> 0
        self.buffers: dict = {}
        self.additive: dict = {}

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as 0 / -inf in dtype, built once a step (SDPA would otherwise
        convert the boolean mask in every layer)."""
        mask = self.additive.get(dtype)
        if mask is None:
            mask = self.additive[dtype] = torch.zeros(self.mask.shape, dtype=dtype).masked_fill_(
                ~self.mask, float("-inf"))
        return mask

    def gather(self, cache: torch.Tensor, which: int) -> torch.Tensor:
        """[B, H_kv, S, D] strided view of each sequence's blocks (whole blocks copied
        into a buffer this step's layers share; padding table entries read block 0)."""
        flat = cache.view(cache.shape[0], -1)
        key = (which, flat.dtype, flat.shape[1])
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = flat.new_empty(self.blocks.shape[0], flat.shape[1])
        torch.index_select(flat, 0, self.blocks, out=buf)
        batch = self.mask.shape[0]
        return buf.view(batch, -1, *cache.shape[2:]).transpose(1, 2)


def _plan(block_tables, context_lens, cu_seqlens_q, n_q: int, group: int,
          block_size: int) -> _Plan:
    """The step's plan, built by its first layer: a plan is a function of the metadata's
    values, so the next layers (same values) reuse it. Compared by value, not identity:
    static decode buffers are refilled in place step after step."""
    tensors = [t for t in (block_tables, context_lens, cu_seqlens_q) if t is not None]
    shape = (n_q, group, block_size, cu_seqlens_q is None)
    kind = "decode" if cu_seqlens_q is None else "extend"
    cached = getattr(_local, kind, None)
    if cached is not None and cached[0] == shape and all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(cached[1], tensors)):
        return cached[2]
    plan = _Plan(block_tables, context_lens, cu_seqlens_q, n_q, group, block_size)
    setattr(_local, kind, (shape, [t.clone() for t in tensors], plan))
    return plan


def _attend(plan: _Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
    """q [B, Q, H, D] (query i of sequence b sits at position ctx_b - num_new_b + i) ->
    [B, Q, H, D]. Queries past num_new_b are padding: they see a valid prefix, and the
    caller drops them."""
    batch, n_q, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    k = dequantize(plan.gather(k_cache, 0), k_scale, q.dtype, head_dim=1)
    v = dequantize(plan.gather(v_cache, 1), v_scale, q.dtype, head_dim=1)
    # GQA without repeating K/V: the `group` query heads of one KV head become rows
    qg = q.view(batch, n_q, n_kv, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(batch, n_kv, group * n_q, head_dim)
    if qg.dtype != k.dtype:
        qg = qg.to(k.dtype)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=plan.additive_mask(k.dtype),
                                         scale=scale)
    if plan.has_empty_rows:
        out = out.nan_to_num_(0.0)      # a sequence with no context: zeros, as the reference
    out = out.view(batch, n_kv, group, n_q, head_dim).permute(0, 3, 1, 2, 4).reshape(
        batch, n_q, n_heads, head_dim)
    return out if out.dtype == q.dtype else out.to(q.dtype)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """As reference.paged_decode_attention: q [B, H, D] -> [B, H, D]."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    plan = _plan(block_tables, context_lens, None, 1,
                 q.shape[1] // k_cache.shape[2], k_cache.shape[1])
    return _attend(plan, q[:, None], k_cache, v_cache, scale, k_scale, v_scale)[:, 0]


rotary_decode_attention = _rotary_then_decode(rotary_store_kv, paged_decode_attention)


def paged_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           context_lens: torch.Tensor, max_seqlen_q: int,
                           scale: float, *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """As reference.paged_extend_attention: the B sequences' new tokens padded to
    max_seqlen_q rows each, attended in one call, unpadded."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    n_q = max(1, max_seqlen_q)
    plan = _plan(block_tables, context_lens, cu_seqlens_q, n_q,
                 q.shape[1] // k_cache.shape[2], k_cache.shape[1])
    batch = block_tables.shape[0]
    padded = q.new_zeros(batch * n_q, *q.shape[1:]).index_copy_(0, plan.rows, q)
    out = _attend(plan, padded.view(batch, n_q, *q.shape[1:]), k_cache, v_cache, scale,
                  k_scale, v_scale)
    return out.reshape(batch * n_q, *q.shape[1:]).index_select(0, plan.rows)

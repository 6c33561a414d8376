"""The CPU backend ("torch_sdpa", as vLLM's CPU attention backend): the references of
kernels/reference.py for everything but paged attention, which runs here as one
batched `scaled_dot_product_attention` per layer (torch's fused CPU flash kernel).

Why: the reference gathers each sequence's K/V with advanced indexing, casts it to
float32 and runs an einsum that copies K/V again into head-major layout (extend: one
Python iteration per sequence). Here each layer copies only whole KV blocks (one
`index_select` of contiguous block rows for K and one for V) and hands SDPA strided
views of them: no cast (the cache dtype is kept; SDPA accumulates in float32), no
layout copy, no per-sequence loop. Decode is the same call as extend with one query
per sequence. Same signatures and semantics as the reference (tests/test_cpu_ops.py);
not CUDA-graph-safe (it reads the longest context on the host).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.reference import (linear, rms_norm, rms_norm_linear, rotary_embedding,  # noqa: F401
                               rotary_store_kv, silu_and_mul, silu_mul_linear,
                               store_kv_cache)


def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """[B, n_blocks * block_size, H_kv, D]: each sequence's first n_blocks blocks, copied
    as whole contiguous blocks (padding entries of a table read block 0, masked later)."""
    batch = block_tables.shape[0]
    rows = cache.view(cache.shape[0], -1).index_select(0, block_tables[:, :n_blocks].reshape(-1))
    return rows.view(batch, n_blocks * cache.shape[1], *cache.shape[2:])


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_tables: torch.Tensor, context_lens: torch.Tensor, num_new: torch.Tensor,
            max_len: int, scale: float) -> torch.Tensor:
    """q [B, Q, H, D] (query i of sequence b sits at position ctx_b - num_new_b + i) ->
    [B, Q, H, D]. Queries past num_new_b are padding: they see a valid prefix, and the
    caller drops them."""
    batch, n_q, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    n_blocks = max(1, -(-max_len // k_cache.shape[1]))
    k = _gather_blocks(k_cache, block_tables, n_blocks).transpose(1, 2)   # [B, H_kv, S, D]
    v = _gather_blocks(v_cache, block_tables, n_blocks).transpose(1, 2)
    lens = context_lens.to(torch.int64)
    q_pos = (lens - num_new.to(torch.int64))[:, None] + torch.arange(n_q)[None, :]   # [B, Q]
    visible = torch.arange(k.shape[2])[None, None, :] <= q_pos[:, :, None]         # [B, Q, S]
    visible &= torch.arange(k.shape[2])[None, None, :] < lens[:, None, None]
    # GQA without repeating K/V: the `group` query heads of one KV head become rows
    qg = q.view(batch, n_q, n_kv, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(batch, n_kv, group * n_q, head_dim)
    mask = visible[:, None].expand(batch, group, n_q, -1).reshape(batch, 1, group * n_q, -1)
    out = F.scaled_dot_product_attention(qg.to(k.dtype), k, v, attn_mask=mask, scale=scale)
    out = out.nan_to_num_(0.0)          # a sequence with no context: zeros, as the reference
    return out.view(batch, n_kv, group, n_q, head_dim).permute(0, 3, 1, 2, 4).reshape(
        batch, n_q, n_heads, head_dim).to(q.dtype)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """As reference.paged_decode_attention: q [B, H, D] -> [B, H, D]."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    ones = torch.ones_like(context_lens)
    return _attend(q[:, None], k_cache, v_cache, block_tables, context_lens, ones,
                   int(context_lens.max()), scale)[:, 0]


def paged_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           context_lens: torch.Tensor, max_seqlen_q: int,
                           scale: float) -> torch.Tensor:
    """As reference.paged_extend_attention: the B sequences' new tokens padded to
    max_seqlen_q rows each, attended in one call, unpadded."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    cu = cu_seqlens_q.to(torch.int64)
    num_new = cu[1:] - cu[:-1]
    batch = num_new.shape[0]
    n_q = max(1, max_seqlen_q)
    # row of token t in the padded [B * n_q] layout: its sequence's base + its index
    seq = torch.repeat_interleave(torch.arange(batch), num_new)
    rows = seq * n_q + torch.arange(q.shape[0]) - cu[:-1].index_select(0, seq)
    padded = q.new_zeros(batch * n_q, *q.shape[1:]).index_copy_(0, rows, q)
    out = _attend(padded.view(batch, n_q, *q.shape[1:]), k_cache, v_cache, block_tables,
                  context_lens, num_new, int(context_lens.max()), scale)
    return out.reshape(batch * n_q, *q.shape[1:]).index_select(0, rows)

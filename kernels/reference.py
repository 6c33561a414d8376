"""Plain-torch references for every kernel in this package.

Each function here has the same signature and semantics as its Triton twin. They are
the CPU path of the engine and the oracle of the kernel tests, so they favour
clarity and exactness (float32 accumulation) over speed.

Layouts (shared with the Triton kernels):
  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], one pair per layer.
  slot = block_id * block_size + offset; slot -1 means "do not store".
  block_tables:     [num_seqs, max_blocks_per_seq] int32, padded with 0 (never read past
                    the sequence's context length).
  context_lens:     [num_seqs] int32, number of KV positions visible to the sequence,
                    counting the new tokens of this step (whose K/V are already stored).
  k_scale, v_scale: keyword-only, [num_kv_heads] float32, for a float8_e4m3fn cache: it
                    holds value / scale per head (kernels/kv_quant.py); None: unit scales.
                    Callers pass them only with an fp8 cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.kv_quant import byte_view, dequantize, quantize


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                   k_scale: torch.Tensor | None = None,
                   v_scale: torch.Tensor | None = None) -> None:
    """Write key/value [T, H_kv, D] into the paged caches at slot_mapping [T] (in place)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for x, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        flat = byte_view(cache.view(-1, *cache.shape[2:]))
        flat.index_copy_(0, slots, byte_view(quantize(x[keep], cache.dtype, scale)))


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int,
               scale: torch.Tensor | None) -> torch.Tensor:
    """[length, H_kv, D] float32 copy of one sequence's paged K or V (dequantized)."""
    block_size = cache.shape[1]
    n_blocks = (length + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:n_blocks].long())
    return dequantize(blocks.reshape(-1, *cache.shape[2:])[:length], scale, torch.float32)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """q [Q, H, D], k/v [S, H_kv, D], mask [Q, S] (True = visible) -> [Q, H, D] in float32."""
    n_q, n_heads, _ = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    qg = q.float().view(n_q, n_kv, group, -1).permute(1, 2, 0, 3)      # [H_kv, G, Q, D]
    kt = k.float().permute(1, 2, 0)                                     # [H_kv, D, S]
    scores = torch.matmul(qg, kt.unsqueeze(1)) * scale                 # [H_kv, G, Q, S]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.float().permute(1, 0, 2).unsqueeze(1))  # [H_kv, G, Q, D]
    return out.permute(2, 0, 1, 3).reshape(n_q, n_heads, -1)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence. q [B, H, D] -> out [B, H, D] (q.dtype).

    Sequence b attends to KV positions [0, context_lens[b]); a sequence with no context
    gets zeros. Batched over sequences (padded to the longest, masked), which keeps the
    CPU engine's decode steps to a handful of ops per layer.
    """
    batch, n_heads, head_dim = q.shape
    if batch == 0:
        return torch.empty_like(q)
    page, n_kv = k_cache.shape[1], k_cache.shape[2]
    lens = context_lens.to(torch.int64)
    n_blocks = max(1, -(-int(lens.max()) // page))
    blocks = block_tables[:, :n_blocks].long()
    k = dequantize(k_cache[blocks].reshape(batch, n_blocks * page, n_kv, head_dim), k_scale,
                   torch.float32)
    v = dequantize(v_cache[blocks].reshape(batch, n_blocks * page, n_kv, head_dim), v_scale,
                   torch.float32)
    visible = torch.arange(n_blocks * page, device=q.device)[None, :] < lens[:, None]
    qg = q.float().view(batch, n_kv, n_heads // n_kv, head_dim)
    scores = torch.einsum("bkgd,bskd->bkgs", qg, k) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)    # no context: all zeros
    out = torch.einsum("bkgs,bskd->bkgd", probs, v).reshape(batch, n_heads, head_dim)
    return out.to(q.dtype)


def paged_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           context_lens: torch.Tensor, max_seqlen_q: int,
                           scale: float, *, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of new tokens over a cached prefix plus themselves.

    q [T, H, D] packs the new tokens of B sequences (cu_seqlens_q [B+1]). Sequence b has
    n_b = cu[b+1]-cu[b] new tokens at positions [ctx_b - n_b, ctx_b) where ctx_b =
    context_lens[b]; its query i sees KV positions [0, ctx_b - n_b + i].
    max_seqlen_q is max(n_b), given by the host so kernels need no sync.
    """
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b, length in enumerate(lens):
        s, e = starts[b], starts[b + 1]
        n_new = e - s
        if n_new == 0:
            continue
        k = _gather_kv(k_cache, block_tables[b], length, k_scale)
        v = _gather_kv(v_cache, block_tables[b], length, v_scale)
        q_pos = torch.arange(length - n_new, length, device=q.device)
        kv_pos = torch.arange(length, device=q.device)
        mask = kv_pos[None, :] <= q_pos[:, None]
        out[s:e] = _attend(q[s:e], k, v, mask, scale).to(q.dtype)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim. With residual: h = x + residual, returns (norm(h), h)."""
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
        new_residual = x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = (normed * weight.float()).to(x.dtype)
    return out if residual is None else (out, new_residual)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool = True):
    """Apply rotary embedding. query [T, H, D], key [T, H_kv, D]; returns new (q, k).

    cos_sin_cache [max_pos, rot_dim] holds cos in its first half, sin in its second.
    Only the first rot_dim dims of each head rotate. is_neox: rotate halves (Llama/HF
    style); otherwise rotate interleaved pairs (GPT-J style).
    """
    cos_sin = cos_sin_cache.index_select(0, positions.long())
    cos, sin = cos_sin.float().chunk(2, dim=-1)                 # [T, rot/2] each
    return (_rotate(query, cos, sin, is_neox), _rotate(key, cos, sin, is_neox))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool):
    rot_dim = cos.shape[-1] * 2
    rot, passthrough = x[..., :rot_dim].float(), x[..., rot_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated.to(x.dtype), passthrough), dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up, [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias, weight [N, K] in nn.Linear layout (exactly F.linear)."""
    return F.linear(x, weight, bias)


def rotary_store_kv(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """rotary_embedding then store_kv_cache of the rotated key and the value; returns the
    rotated query (a new tensor). The caches are written in place; inputs are untouched."""
    q, k = rotary_embedding(positions, query, key, cos_sin_cache, is_neox)
    store_kv_cache(k, value, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return q


def _rotary_then_decode(rotary_store_kv, paged_decode_attention):
    """rotary_decode_attention of a backend from its rotary_store_kv and decode attention
    (the Triton backend fuses the two into one launch)."""
    def rotary_decode_attention(positions, query, key, value, cos_sin_cache, is_neox: bool,
                                k_cache, v_cache, slot_mapping, block_tables, context_lens,
                                scale: float, rows_shared: bool = False,
                                **knobs) -> torch.Tensor:
        """A decode-only step's attention: rotary_store_kv, then paged_decode_attention
        of the rotated query (knobs: the decode attention's own; k_scale and v_scale go
        to both). Every row is stored before any attends, so rows of one sequence
        (rows_shared, speculative decoding's verify rows) see each other's K/V."""
        scales = {k: knobs.pop(k) for k in ("k_scale", "v_scale") if k in knobs}
        q = rotary_store_kv(positions, query, key, value, cos_sin_cache, is_neox,
                            k_cache, v_cache, slot_mapping, **scales)
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale,
                                      **scales, **knobs)
    return rotary_decode_attention


rotary_decode_attention = _rotary_then_decode(rotary_store_kv, paged_decode_attention)


def _norm_then_linear(rms_norm, linear):
    """rms_norm_linear of a backend from its rms_norm and linear (one composition for
    every backend that does not fuse the two)."""
    def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None = None,
                        residual: torch.Tensor | None = None):
        """linear(rms_norm(x, norm_weight, eps[, residual]), weight, bias); with residual
        returns (y, x + residual) like rms_norm."""
        if residual is None:
            return linear(rms_norm(x, norm_weight, eps), weight, bias)
        h, new_residual = rms_norm(x, norm_weight, eps, residual)
        return linear(h, weight, bias), new_residual
    return rms_norm_linear


rms_norm_linear = _norm_then_linear(rms_norm, linear)


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu_and_mul(x), weight, bias): x [..., 2K] = [gate | up], weight [N, K]."""
    return linear(silu_and_mul(x), weight, bias)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token of each row: [M, V] -> int64 [M] (first index of the maximum)."""
    return logits.argmax(dim=-1)


def top_logprobs(src: torch.Tensor, tokens: torch.Tensor, n: int, normalize: bool,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Row rows[j] of src [R, V] (row j without rows), with its token tokens[j]: int32
    [L, 2n + 3] packed as kernels/logprobs.py's LAYOUT: the token and the top n ids, their
    values (the row's log-softmax if normalize, else the row as float32) and the token's
    rank (1 + entries strictly above it)."""
    x = (src if rows is None else src.index_select(0, rows)).float()
    if normalize:
        x = torch.log_softmax(x, dim=-1)
    tok = tokens[:, None].to(torch.int64)
    picked = x.gather(1, tok)
    ranks = (x > picked).sum(dim=-1, keepdim=True) + 1
    ids, values = tok, picked
    if n:
        top = torch.topk(x, n, dim=-1)
        ids, values = torch.cat((tok, top.indices), 1), torch.cat((picked, top.values), 1)
    return torch.cat((ids.to(torch.int32), values.view(torch.int32), ranks.to(torch.int32)), 1)

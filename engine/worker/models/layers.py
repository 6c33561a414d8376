"""Building blocks shared by the model implementations.

Layers call the active kernel backend through `ops` (torch references on CPU, Triton on
CUDA), so one model definition serves both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch import nn

from engine.config import InvalidRequestError
from kernels.kv_quant import scales_from


@dataclass
class AttentionMetadata:
    """How the flattened tokens of one step map onto the paged KV cache.

    Tokens are laid out decodes first (one per sequence), then prefill chunks.
    """

    slot_mapping: torch.Tensor          # [T] int64, -1 = padding (not stored)
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None = None   # [D, M] int32
    decode_context_lens: torch.Tensor | None = None   # [D] int32
    # decode rows of one sequence (speculative decoding's verified positions, in position
    # order): each row sees the K/V its sequence's earlier rows store in the same step
    # (rotary_decode_attention's rows_shared)
    decode_rows_shared: bool = False
    prefill_block_tables: torch.Tensor | None = None  # [P, M] int32
    prefill_cu_seqlens_q: torch.Tensor | None = None  # [P+1] int32
    prefill_context_lens: torch.Tensor | None = None  # [P] int32
    prefill_max_seqlen_q: int = 0
    # Mixed steps from the CUDA-graph buffers (engine/worker/cuda_graphs.py): every sequence,
    # decodes first, padded to fixed capacities; one unified attention launch (CUDA only)
    query_start_loc: torch.Tensor | None = None       # [S+1] int32
    seq_lens: torch.Tensor | None = None              # [S] int32
    block_tables: torch.Tensor | None = None          # [S, M] int32
    _order: dict | None = field(default=None, repr=False)

    def order_kwargs(self, ops) -> dict:
        """{"order": the decode rows longest context first} for a backend whose decode
        launch schedules by it (ops.decode_order: the Triton one, docs/KERNELS.md
        "Longest first"), computed at the first layer and shared by the others (in a
        CUDA graph: one small sort a replay); {} for any other backend."""
        if self._order is None:
            make = getattr(ops, "decode_order", None)
            order = None if make is None or self.decode_context_lens is None \
                else make(self.decode_context_lens)
            self._order = {} if order is None else {"order": order}
        return self._order


class PagedAttention(nn.Module):
    """Stores this step's K/V in the layer's paged cache, then attends (decode + extend).

    An fp8 cache comes with its per-head scales (engine/worker/placement.py), which every
    op that stores or reads the cache takes as `**self.kv_scales` (empty for a float
    cache, so its calls are as before). `calibrating`: the next store first sets the
    scales from the values it stores (calculate_kv_scales; the runner sets it for one
    eager step)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.ops: ModuleType | None = None
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.set_kv_scales(None, None)
        self.calibrating = False

    def set_kv_scales(self, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None):
        """The cache's [kv_heads] scales (views into the pool's), None for a float cache."""
        self.k_scale, self.v_scale = k_scale, v_scale
        self.kv_scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}

    def calibrate(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Set the scales from this step's stored K and V [T, kv_heads, D] (padding rows,
        slot -1, left out), in place, then stop calibrating."""
        keep = slot_mapping >= 0
        self.k_scale.copy_(scales_from(k[keep]))
        self.v_scale.copy_(scales_from(v[keep]))
        self.calibrating = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata, kv_stored: bool = False) -> torch.Tensor:
        """kv_stored: the caller already wrote this step's K/V (ops.rotary_store_kv)."""
        ops, sc = self.ops, self.kv_scales
        if not kv_stored:
            if self.calibrating:
                self.calibrate(k, v, meta.slot_mapping)
            ops.store_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping, **sc)
        if meta.query_start_loc is not None:   # CUDA graph of a mixed step
            return ops.paged_unified_attention(q, self.k_cache, self.v_cache,
                                               meta.block_tables, meta.query_start_loc,
                                               meta.seq_lens, self.scale, **sc)
        n_dec = meta.num_decode_tokens
        if n_dec == q.shape[0]:
            return ops.paged_decode_attention(q, self.k_cache, self.v_cache,
                                              meta.decode_block_tables,
                                              meta.decode_context_lens, self.scale, **sc,
                                              **meta.order_kwargs(ops))
        out = torch.empty_like(q)
        if n_dec:
            out[:n_dec] = ops.paged_decode_attention(
                q[:n_dec], self.k_cache, self.v_cache, meta.decode_block_tables,
                meta.decode_context_lens, self.scale, **sc, **meta.order_kwargs(ops))
        out[n_dec:] = ops.paged_extend_attention(
            q[n_dec:], self.k_cache, self.v_cache, meta.prefill_block_tables,
            meta.prefill_cu_seqlens_q, meta.prefill_context_lens,
            meta.prefill_max_seqlen_q, self.scale, **sc)
        return out


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int,
                       attention_scaling: float = 1.0) -> torch.Tensor:
    """[max_positions, rot_dim] with cos in the first half, sin in the second (float32)."""
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float().to(t.device))   # t follows the default device
    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)


def rope_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling as the HF config asks (any rope type)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:  # transformers 4.x spelling
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    partial = getattr(config, "partial_rotary_factor", 1.0)
    dim = int(head_dim * partial)
    if rope_type == "default":
        base = params.get("rope_theta", 10000.0)
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0:
            raise InvalidRequestError(f"config field rope_theta must be > 0, got {base!r}")
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise InvalidRequestError(f"config field rope_type: unsupported rope type "
                                  f"{rope_type!r}; supported: default, "
                                  f"{', '.join(sorted(ROPE_INIT_FUNCTIONS))}")
    try:
        inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        raise InvalidRequestError(f"config field rope_scaling ({rope_type}): {exc}") from exc
    return inv.float(), float(scaling)

"""One step from plain numpy arrays: what every rank runs (rank 0 then samples).

`StepArrays` is the message rank 0 broadcasts: the step's ids, positions, slot mapping,
block tables, context lengths, cu_seqlens, logits rows and copy-on-write pairs, all numpy
(pickle-able, no Python objects of the scheduler). The engine's StepBatch (issue 12) can
be sent as is when it carries these field names; `EagerStepRunner` is the worker's
default runner (no CUDA graphs): a runner factory can replace it (see worker.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.models.layers import AttentionMetadata


@dataclass(frozen=True)
class StepArrays:
    input_ids: np.ndarray                       # [T] int64, decodes first
    positions: np.ndarray                       # [T] int64
    slot_mapping: np.ndarray                    # [T] int64
    logits_indices: np.ndarray                  # [S] int64
    num_decode_tokens: int
    decode_block_tables: np.ndarray | None = None    # [D, M] int32
    decode_context_lens: np.ndarray | None = None    # [D] int32
    prefill_block_tables: np.ndarray | None = None   # [P, M] int32
    prefill_cu_seqlens_q: np.ndarray | None = None   # [P+1] int32
    prefill_context_lens: np.ndarray | None = None   # [P] int32
    prefill_max_seqlen_q: int = 0
    cow_src: np.ndarray | None = None                # [C] int64 blocks copied before the step
    cow_dst: np.ndarray | None = None


def _dev(array: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    if array is None:
        return None
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)


def attention_metadata(step, device: torch.device) -> AttentionMetadata:
    """AttentionMetadata of any object with StepArrays' field names."""
    return AttentionMetadata(
        slot_mapping=_dev(step.slot_mapping, device),
        num_decode_tokens=int(step.num_decode_tokens),
        decode_block_tables=_dev(step.decode_block_tables, device),
        decode_context_lens=_dev(step.decode_context_lens, device),
        prefill_block_tables=_dev(step.prefill_block_tables, device),
        prefill_cu_seqlens_q=_dev(step.prefill_cu_seqlens_q, device),
        prefill_context_lens=_dev(step.prefill_context_lens, device),
        prefill_max_seqlen_q=int(step.prefill_max_seqlen_q))


def allocate_kv_cache(model, ops, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """This rank's KV pool [2, layers, blocks, block_size, local kv heads, head_dim], the
    same block ids on every rank, bound to the model's attention layers."""
    model.ops = ops
    layers = model.attention_layers()
    kv = torch.zeros(2, len(layers), num_blocks, block_size, layers[0].num_kv_heads,
                     layers[0].head_dim, dtype=dtype, device=device)
    for i, layer in enumerate(layers):
        layer.ops = ops
        layer.k_cache, layer.v_cache = kv[0, i], kv[1, i]
    return kv


class EagerStepRunner:
    """A rank's forward over its shard and KV pool; every step eager."""

    def __init__(self, model, ops, device: torch.device, dtype: torch.dtype,
                 num_blocks: int, block_size: int):
        self.model, self.device = model, device
        self.kv_cache = allocate_kv_cache(model, ops, num_blocks, block_size, dtype, device)

    @torch.inference_mode()
    def execute(self, step) -> torch.Tensor:
        """Copy-on-write copies, then the forward; returns logits [S, V] (full vocab)."""
        if step.cow_src is not None and len(step.cow_src):
            src, dst = _dev(step.cow_src, self.device), _dev(step.cow_dst, self.device)
            self.kv_cache.index_copy_(2, dst, self.kv_cache.index_select(2, src))
        meta = attention_metadata(step, self.device)
        return self.model(_dev(step.input_ids, self.device), _dev(step.positions, self.device),
                          meta, _dev(step.logits_indices, self.device))

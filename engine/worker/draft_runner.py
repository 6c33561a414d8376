"""The draft model of speculative decoding's method draft_model (docs/SPECULATIVE.md
"Draft model"): a second, smaller model beside the target, with its own paged KV cache.

Worker side only: forwards and their argmax. Which tokens the draft has seen, its block
tables and the pool's free list are the core's (engine/core/draft_proposer.py), which
passes flat numpy columns in the target's layout (AttentionMetadata): extends (many
tokens per sequence) and decodes (one each). Eager (no CUDA graphs): a
draft forward is a few small launches; the same model classes, loader and attention ops
as the target (CPU float32 and GPU).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import DEFAULT_DRAFT_MODEL, InvalidRequestError
from engine.worker.models.layers import AttentionMetadata
from engine.worker.models.loader import LoadedModel, load_model
from engine.worker.placement import kv_cache_zeros


@dataclass
class DraftExtend:
    """One extend over several sequences: their tokens flattened, in order."""
    input_ids: np.ndarray       # [T] int64
    positions: np.ndarray       # [T] int64
    slot_mapping: np.ndarray    # [T] int64
    cu_seqlens_q: np.ndarray    # [S+1] int32
    context_lens: np.ndarray    # [S] int32: tokens in the KV once this step is stored
    block_tables: np.ndarray    # [S, M] int32


@dataclass
class DraftDecode:
    """One token per sequence."""
    input_ids: np.ndarray       # [S] int64
    positions: np.ndarray       # [S] int64
    slot_mapping: np.ndarray    # [S] int64
    context_lens: np.ndarray    # [S] int32
    block_tables: np.ndarray    # [S, M] int32


def load_draft(name: str, target_vocab: int, device: torch.device,
               dtype: torch.dtype, seed: int) -> LoadedModel:
    """The draft model; refused unless its vocabulary is the target's (a draft id must
    mean the same token to both)."""
    if name == DEFAULT_DRAFT_MODEL and not os.path.exists(os.path.join(name, "config.json")):
        raise InvalidRequestError(f"the bundled draft model is missing at {name}")
    loaded = load_model(name, device, dtype, seed)
    vocab = loaded.model.config.vocab_size
    if vocab != target_vocab:
        raise InvalidRequestError(f"speculative_config model {name!r} has vocab_size {vocab}, "
                                  f"the target {target_vocab}: a draft needs the target's "
                                  f"vocabulary")
    return loaded


class DraftRunner:
    def __init__(self, loaded: LoadedModel, ops, device: torch.device, dtype: torch.dtype,
                 num_blocks: int, block_size: int):
        self.model, self.device = loaded.model, device
        self.max_model_len = loaded.max_model_len
        self.num_blocks, self.block_size = num_blocks, block_size
        self.model.ops = ops
        layers = self.model.attention_layers()
        first = layers[0]
        self.kv_cache = kv_cache_zeros((2, len(layers), num_blocks, block_size,
                                        first.num_kv_heads, first.head_dim), dtype, device)
        for i, layer in enumerate(layers):
            layer.ops = ops
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        self.forward_calls = 0
        if device.type == "cuda":
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile the draft's kernels at start, not in the first request's step (an
        extend and a decode of slot 0, which later writes overwrite)."""
        one, zero = np.ones(1, np.int32), np.zeros(1, np.int64)
        table = np.zeros((1, 1), np.int32)
        self.extend(DraftExtend(zero, zero, zero, np.array([0, 1], np.int32), one, table))
        self.decode(DraftDecode(zero, zero, zero, one, table))
        self.forward_calls = 0

    @staticmethod
    def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
        layers = model.attention_layers()
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * len(layers) * block_size * layers[0].num_kv_heads * layers[0].head_dim * elem

    def _to(self, a: np.ndarray, dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype)).to(self.device)

    @torch.inference_mode()
    def extend(self, step: DraftExtend) -> np.ndarray:
        """Store every sequence's tokens in the draft's KV; the argmax after each
        sequence's last token ([S] int64, on the host)."""
        meta = AttentionMetadata(
            slot_mapping=self._to(step.slot_mapping, np.int64), num_decode_tokens=0,
            prefill_block_tables=self._to(step.block_tables, np.int32),
            prefill_cu_seqlens_q=self._to(step.cu_seqlens_q, np.int32),
            prefill_context_lens=self._to(step.context_lens, np.int32),
            prefill_max_seqlen_q=int(np.diff(step.cu_seqlens_q).max()))
        last = step.cu_seqlens_q[1:].astype(np.int64) - 1
        return self._greedy(step.input_ids, step.positions, meta, last)

    @torch.inference_mode()
    def decode(self, step: DraftDecode) -> np.ndarray:
        """One token per sequence into the draft's KV; the argmax after each ([S])."""
        meta = AttentionMetadata(
            slot_mapping=self._to(step.slot_mapping, np.int64),
            num_decode_tokens=step.input_ids.shape[0],
            decode_block_tables=self._to(step.block_tables, np.int32),
            decode_context_lens=self._to(step.context_lens, np.int32))
        return self._greedy(step.input_ids, step.positions, meta, None)

    def _greedy(self, ids: np.ndarray, positions: np.ndarray, meta: AttentionMetadata,
                rows: np.ndarray | None) -> np.ndarray:
        self.forward_calls += 1
        logits = self.model(self._to(ids, np.int64), self._to(positions, np.int64), meta,
                            None if rows is None else self._to(rows, np.int64))
        return logits.argmax(dim=-1).cpu().numpy()


def build_draft_runner(name: str, target_vocab: int, ops, device: torch.device,
                       dtype: torch.dtype, num_blocks: int, block_size: int,
                       seed: int) -> DraftRunner:
    return DraftRunner(load_draft(name, target_vocab, device, dtype, seed), ops, device,
                       dtype, num_blocks, block_size)

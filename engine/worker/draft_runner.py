"""The draft model of speculative decoding's method draft_model (docs/SPECULATIVE.md
"Draft model"): a second, smaller model beside the target, with its own paged KV cache.

Worker side only: forwards and their argmax; the executor owns it
(engine/worker/executor.py). Which tokens the draft has seen, its block tables and the
pool's free list are the core's (engine/core/draft_proposer.py), which passes numpy
columns (engine/worker/draft_batch.py) in the target's layout: extends (many tokens
per sequence, eager) and decode chains (one token per sequence and position, n
positions back to back on the device: engine/worker/draft_graphs.py, CUDA graphs on
the GPU). The same model classes, loader and attention ops as the target (CPU float32
and GPU).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from engine.config import DEFAULT_DRAFT_MODEL, InvalidRequestError
from engine.worker.draft_batch import DraftChain, DraftExtend
from engine.worker.draft_graphs import DraftGraphs
from engine.worker.models.layers import AttentionMetadata
from engine.worker.models.loader import LoadedModel, load_model
from engine.worker.placement import attach_kv_cache


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
                 num_blocks: int, block_size: int, max_rows: int = 1, max_chain: int = 1,
                 use_graphs: bool = False):
        """max_rows, max_chain: the chains the static buffers hold (max_num_seqs and
        k + 1 at start); use_graphs: capture them (CUDA with graph-safe ops)."""
        self.model, self.device = loaded.model, device
        self.max_model_len = loaded.max_model_len
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_blocks_per_seq = -(-self.max_model_len // block_size)
        self.kv_cache, _ = attach_kv_cache(self.model, ops, num_blocks, block_size, dtype,
                                           device)
        self.forward_calls = 0
        self.chains = DraftGraphs(self, max_rows, max_chain, use_graphs,
                                  pad=device.type == "cuda")
        if device.type == "cuda":
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile the draft's kernels at start, not in the first request's step (an
        extend of slot 0, which later writes overwrite; the chains store nothing), and
        capture the chains' graphs."""
        one, zero = np.ones(1, np.int32), np.zeros(1, np.int64)
        table = np.zeros((1, 1), np.int32)
        self.extend(DraftExtend(zero, zero, zero, np.array([0, 1], np.int32), one, table))
        if self.chains.use_graphs:
            self.chains.capture()
        else:
            self.chains.warm()
        self.forward_calls = 0

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

    def decode_chain(self, chain: DraftChain) -> np.ndarray:
        """The chain's tokens into the draft's KV; the argmax after each, [S, n]."""
        self.forward_calls += 1
        return self.chains.run(chain)

    def _greedy(self, ids: np.ndarray, positions: np.ndarray, meta: AttentionMetadata,
                rows: np.ndarray | None) -> np.ndarray:
        self.forward_calls += 1
        logits = self.model(self._to(ids, np.int64), self._to(positions, np.int64), meta,
                            None if rows is None else self._to(rows, np.int64))
        return logits.argmax(dim=-1).cpu().numpy()


def build_draft_runner(name: str, target_vocab: int, ops, device: torch.device,
                       dtype: torch.dtype, num_blocks: int, block_size: int, seed: int,
                       **chains) -> DraftRunner:
    """chains: DraftRunner's max_rows, max_chain, use_graphs."""
    return DraftRunner(load_draft(name, target_vocab, device, dtype, seed), ops, device,
                       dtype, num_blocks, block_size, **chains)

"""Helpers of the tensor-parallel tests: sharded checkpoints and a paged multi-step driver."""
from __future__ import annotations

import json

import numpy as np
import torch

from engine.worker.step_batch import SamplingColumns, StepBatch

BLOCK_SIZE = 4
NUM_BLOCKS = 64
MAX_MODEL_LEN = 128
# the engine's ModelRunner on CPU: eager, unpadded (rank 0 and the workers alike)
RUNNER_KW = dict(max_model_len=MAX_MODEL_LEN, use_cuda_graphs=False, graph_safe_ops=False)


def greedy_columns(n: int) -> SamplingColumns:
    return SamplingColumns(tuple(f"r{i}" for i in range(n)), True, np.ones(n, bool),
                           np.ones(n, np.float32), np.zeros(n, np.int64), np.ones(n, np.float32),
                           np.zeros(n, bool), np.zeros(n, np.uint64))


def shard_checkpoint(path, num_files: int = 2) -> None:
    """Re-save model.safetensors as model-0000x-of-0000y.safetensors + index.json, the
    tensors dealt round-robin (q/k/v of one layer land in different files)."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = [f"model-{i + 1:05d}-of-{num_files:05d}.safetensors" for i in range(num_files)]
    weight_map = {k: names[i % num_files] for i, k in enumerate(sorted(tensors))}
    for name in names:
        save_file({k: v for k, v in tensors.items() if weight_map[k] == name}, path / name,
                  metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))


class PagedDriver:
    """Two sequences through the paged KV path: chunked prefill over several blocks, a
    mixed step (one decode + one prefill chunk), then decodes; greedy tokens appended.

    `run(step) -> logits [S, V]` is the forward under test (TP=1 or rank 0 of TP=2)."""

    def __init__(self, prompts: list[list[int]], seed: int = 0):
        blocks = np.random.default_rng(seed).permutation(np.arange(1, NUM_BLOCKS))
        self.tokens = [list(p) for p in prompts]
        self.tables = [blocks[:16].astype(np.int32), blocks[16:32].astype(np.int32)]

    def plan(self, decode_steps: int) -> list[tuple[list[int], list[tuple[int, int, int]]]]:
        """(decoding seqs, [(seq, start, end) prefill chunks]) per step."""
        a, b = (len(t) for t in self.tokens)
        steps = [([], [(0, 0, a // 2), (1, 0, b)]), ([1], [(0, a // 2, a)])]
        return steps + [([0, 1], [])] * decode_steps

    def build(self, decodes: list[int], prefills: list[tuple[int, int, int]]):
        ids, pos, slots, sample_rows, sampled = [], [], [], [], []
        chunks = [(s, len(self.tokens[s]) - 1, len(self.tokens[s])) for s in decodes] + prefills
        for s, start, end in chunks:
            ids.extend(self.tokens[s][start:end])
            pos.extend(range(start, end))
            slots.append(self._slots(s, np.arange(start, end)))
            if end == len(self.tokens[s]):
                sample_rows.append(len(ids) - 1)
                sampled.append(s)
        slots = np.concatenate(slots)
        lens = [e - st for _, st, e in prefills]
        width = max(len(t) for t in self.tables)
        step = StepBatch(
            input_ids=np.array(ids, np.int64), positions=np.array(pos, np.int64),
            slot_mapping=slots, num_decodes=len(decodes),
            decode_block_tables=self._tables(decodes, width),
            decode_context_lens=np.array([len(self.tokens[s]) for s in decodes], np.int32),
            prefill_block_tables=self._tables([s for s, _, _ in prefills], width),
            prefill_cu_seqlens_q=np.concatenate(([0], np.cumsum(lens))).astype(np.int32),
            prefill_context_lens=np.array([e for _, _, e in prefills], np.int32),
            prefill_max_seqlen_q=max(lens, default=0),
            logits_indices=np.array(sample_rows, np.int64),
            sample_rows=np.arange(len(sample_rows), dtype=np.int64),
            cow_src=np.zeros(0, np.int64), cow_dst=np.zeros(0, np.int64),
            sampling=greedy_columns(len(sample_rows)))
        return step, sampled

    def _slots(self, s: int, positions: np.ndarray) -> np.ndarray:
        table = self.tables[s].astype(np.int64)
        return table[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE

    def _tables(self, seqs: list[int], width: int) -> np.ndarray:
        return np.array([np.pad(self.tables[s], (0, width - len(self.tables[s])))
                         for s in seqs], np.int32).reshape(len(seqs), width)

    def run(self, forward, decode_steps: int = 5) -> tuple[list[torch.Tensor], list[list[int]]]:
        """Every step's logits and the final token lists."""
        all_logits = []
        for decodes, prefills in self.plan(decode_steps):
            step, sampled = self.build(decodes, prefills)
            logits = forward(step)
            all_logits.append(logits.float().clone())
            for row, s in enumerate(sampled):
                self.tokens[s].append(int(logits[row].argmax()))
        return all_logits, self.tokens

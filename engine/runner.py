"""ModelRunner: turns a step plan into tensors, runs one forward, returns logits.

Owns the paged KV cache ([2, layers, blocks, block_size, kv_heads, head_dim]) and the
CUDA graphs of decode-only steps (captured per bucketed batch size; mixed steps run
eagerly).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.cuda_graphs import DecodeGraphs
from engine.device_io import to_device
from engine.warmup import warm_up_attention
from engine.models.layers import AttentionMetadata
from engine.scheduler import ScheduledChunk, StepPlan


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_chunks: list[ScheduledChunk]


class ModelRunner:
    def __init__(self, model, ops, device: torch.device, dtype: torch.dtype, num_blocks: int,
                 block_size: int, max_model_len: int, use_cuda_graphs: bool,
                 graph_safe_ops: bool, max_graph_batch: int = 512, overlap: bool = False):
        self.model, self.ops, self.device, self.dtype = model, ops, device, dtype
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        model.ops = ops
        layers = model.attention_layers()
        first = layers[0]
        self.kv_cache = torch.zeros(2, len(layers), num_blocks, block_size, first.num_kv_heads,
                                    first.head_dim, dtype=dtype, device=device)
        for i, layer in enumerate(layers):
            layer.ops = ops
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        self.forward_calls = 0
        self.warmup_s = 0.0   # start-up kernel compiles (engine/warmup.py)
        self.graphs = None    # decode steps through static buffers (captured unless eager)
        if device.type == "cuda" and graph_safe_ops:
            self.graphs = DecodeGraphs(self, max_graph_batch, use_cuda_graphs)
            if use_cuda_graphs:
                self.graphs.capture()
            else:
                self.graphs.warm()
            self.warmup_s = warm_up_attention(self)
        elif overlap:   # CPU: same static-buffer decode path, unpadded, never captured
            self.graphs = DecodeGraphs(self, max_graph_batch, use_graphs=False, pad=False)

    @staticmethod
    def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
        layers = model.attention_layers()
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * len(layers) * block_size * layers[0].num_kv_heads * layers[0].head_dim * elem

    # -- per step --------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan, token_source: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, list[ScheduledChunk]]:
        """Run the plan's forward; return logits [S, V] (model dtype) and the sampled chunks.
        token_source: device tensor of a decode-only step's input tokens (overlap path)."""
        self.copy_blocks(plan.copies)
        self.forward_calls += 1
        if self.static_decode(plan):
            return self.graphs.run(plan.decodes, token_source), plan.decodes
        assert token_source is None, "device-fed tokens need the static decode path"
        inputs = self.prepare(plan)
        logits = self.model(inputs.input_ids, inputs.positions, inputs.meta, inputs.logits_indices)
        return logits, inputs.sample_chunks

    def static_decode(self, plan: StepPlan) -> bool:
        """Does this plan run through the static decode buffers (graphs)?"""
        return (self.graphs is not None and not plan.prefills
                and self.graphs.fits(len(plan.decodes)))

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """All copy-on-write copies of a step, every layer, K and V: one batched op."""
        if not copies:
            return
        src = to_device([s for s, _ in copies], torch.int64, self.device)
        dst = to_device([d for _, d in copies], torch.int64, self.device)
        self.kv_cache.index_copy_(2, dst, self.kv_cache.index_select(2, src))

    def block_table_array(self, chunks: list[ScheduledChunk], width: int | None = None) -> np.ndarray:
        width = width or max(len(c.request.block_table) for c in chunks)
        table = np.zeros((len(chunks), width), dtype=np.int32)
        for i, c in enumerate(chunks):
            bt = c.request.block_table
            table[i, :len(bt)] = bt
        return table

    def slots(self, table: list[int], positions: np.ndarray) -> np.ndarray:
        blocks = np.asarray(table, dtype=np.int64)[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def prepare(self, plan: StepPlan) -> StepInputs:
        ids, pos, slots, logit_rows, sample_chunks = [], [], [], [], []
        row = 0
        for c in plan.chunks:
            r = c.request
            p = np.arange(c.start, c.start + c.num_tokens, dtype=np.int64)
            end = c.start + c.num_tokens
            n_prompt = r.num_prompt_tokens
            if end <= n_prompt:
                ids.extend(r.prompt_token_ids[c.start:end])
            else:
                ids.extend(r.token_at(j) for j in range(c.start, end))
            pos.append(p)
            slots.append(self.slots(r.block_table, p))
            row += c.num_tokens
            if c.sample:
                logit_rows.append(row - 1)
                sample_chunks.append(c)
        dev = self.device
        to = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a, dtype=dt)).to(dev, non_blocking=True)
        meta = AttentionMetadata(slot_mapping=to(np.concatenate(slots), np.int64),
                                 num_decode_tokens=len(plan.decodes))
        if plan.decodes:
            meta.decode_block_tables = to(self.block_table_array(plan.decodes), np.int32)
            meta.decode_context_lens = to([c.start + 1 for c in plan.decodes], np.int32)
        if plan.prefills:
            lens = [c.num_tokens for c in plan.prefills]
            meta.prefill_block_tables = to(self.block_table_array(plan.prefills), np.int32)
            meta.prefill_cu_seqlens_q = to(np.concatenate(([0], np.cumsum(lens))), np.int32)
            meta.prefill_context_lens = to([c.start + c.num_tokens for c in plan.prefills], np.int32)
            meta.prefill_max_seqlen_q = max(lens)
        return StepInputs(to(ids, np.int64), to(np.concatenate(pos), np.int64), meta,
                          to(logit_rows, np.int64), sample_chunks)

"""CUDA graphs for decode-only steps, one per bucketed batch size.

Static input buffers are filled each step and the graph of the smallest bucket that
holds the batch is replayed. Padding rows store nothing (slot -1) and attend to one
position, so they cost almost nothing and touch no live KV.

Without capture (enforce_eager) the same padded buffers run eagerly, so eager and graph
decode steps have identical shapes, hence identical kernels and bit-identical results.
"""
from __future__ import annotations

import bisect
import gc

import torch

from engine.models.layers import AttentionMetadata

BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256,
           320, 384, 448, 512, 640, 768, 896, 1024]


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, use_graphs: bool = True, pad: bool = True):
        self.runner = runner
        self.use_graphs = use_graphs
        self.pad = pad or use_graphs   # unpadded only for the CPU overlap path
        self.buckets = [b for b in BUCKETS if b <= max_batch] or [1]
        n, dev = self.buckets[-1], runner.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(n, runner.max_blocks_per_seq, dtype=torch.int32, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # Host staging, pinned and double-buffered: copies from pageable memory would wait
        # for the stream (and so for the step in flight); pinned ones are truly async. Two
        # suffice: a buffer is refilled two steps later, after its step was synced.
        pin = dev.type == "cuda"
        self._stage64 = [torch.zeros(3, n, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._stage_lens = [torch.ones(n, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._stage_table = [torch.zeros(n, runner.max_blocks_per_seq, dtype=torch.int32,
                                         pin_memory=pin) for _ in range(2)]
        self._flip = 0

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:bs], num_decode_tokens=bs,
                                 decode_block_tables=self.block_tables[:bs],
                                 decode_context_lens=self.context_lens[:bs])

    def _forward(self, bs: int) -> torch.Tensor:
        return self.runner.model(self.input_ids[:bs], self.positions[:bs], self._meta(bs),
                                 self.logits_indices[:bs])

    @torch.inference_mode()
    def warm(self) -> None:
        """Eager mode: run every bucket once, so its kernels compile now, not mid-serving
        (the static buffers hold no slots: nothing is written to the KV cache)."""
        for bs in self.buckets:
            self._forward(bs)
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture(self) -> None:
        # A dropped engine held by reference cycles dies in some automatic gc run; if
        # that run falls inside a capture, destroying its graphs invalidates the capture
        # (and leaves torch's CUDA RNG unusable for the whole process). Collect now,
        # and not during capture.
        gc.collect()
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            self._capture_all()
        finally:
            if gc_enabled:
                gc.enable()

    def _capture_all(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.buckets):
                self._forward(bs)          # warm up: compile kernels, settle allocations
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._forward(bs)
                pool = graph.pool()
                self.graphs[bs] = (graph, out)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def release(self) -> None:
        """Destroy the captured graphs (before a process group whose collectives they
        captured is destroyed: NCCL waits for every such graph to be gone)."""
        if not self.graphs:
            return
        torch.cuda.synchronize()
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    def run(self, batch, token_source: torch.Tensor | None = None) -> torch.Tensor:
        """Copy a decode-only StepBatch into the static buffers and run it. token_source:
        this step's input tokens as a device tensor (the previous step's samples), else
        they come from batch.input_ids."""
        n = batch.num_decodes
        bs = self.buckets[bisect.bisect_left(self.buckets, n)] if self.pad else n
        k = self._flip
        self._flip ^= 1
        s64, s_lens, s_table = self._stage64[k], self._stage_lens[k], self._stage_table[k]
        ids, pos, slots = s64.numpy()
        lens, table = s_lens.numpy(), s_table.numpy()
        width = batch.decode_block_tables.shape[1]
        slots[n:bs] = -1
        lens[n:bs] = 1
        pos[:n] = batch.positions
        slots[:n] = batch.slot_mapping
        lens[:n] = batch.decode_context_lens
        table[:n, :width] = batch.decode_block_tables
        if token_source is None:
            ids[:n] = batch.input_ids
            self.input_ids[:n].copy_(s64[0, :n], non_blocking=True)
        else:
            self.input_ids[:n].copy_(token_source)
        self.positions[:n].copy_(s64[1, :n], non_blocking=True)
        self.slot_mapping[:bs].copy_(s64[2, :bs], non_blocking=True)
        self.context_lens[:bs].copy_(s_lens[:bs], non_blocking=True)
        self.block_tables[:n, :width].copy_(s_table[:n, :width], non_blocking=True)
        if not self.use_graphs:
            return self._forward(bs)[:n]
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:n]

"""The draft model's decode chains (docs/SPECULATIVE.md "Draft model"): n decode forwards
back to back, each position's argmax staying on the device as the next position's input
where the proposal feeds a draft back, over static buffers; on CUDA one captured graph
per (bucketed rows, n).

A chain's host inputs are computed up front by the core (engine/core/draft_proposer.py):
per position and row the token given by the host (a token the draft has not seen yet),
whether to take the previous position's argmax instead (a draft fed back), its position,
slot and context length; the block tables once (fixed width). Rows past a row's last
position, and padding rows, store nothing (slot -1) and attend to one position. The
argmaxes come back in one copy, [rows, n].

Launches per proposal on CUDA: 3 input copies, 1 graph replay, 1 copy back (one host
sync), whatever k; eager, each forward launches its kernels from the host (a few dozen
for a 2-layer draft), still with no host sync between the positions.
Without capture (CPU, enforce_eager) the same buffers run the same forwards, unpadded
on CPU, so CPU tests cover the chain's logic.
"""
from __future__ import annotations

import bisect
import gc

import numpy as np
import torch

from engine.worker.cuda_graphs import DECODE_BUCKETS
from engine.worker.models.layers import AttentionMetadata


def chain_buckets(max_rows: int) -> list[int]:
    """The decode buckets up to the first that holds max_rows."""
    top = bisect.bisect_left(DECODE_BUCKETS, max_rows)
    return DECODE_BUCKETS[:top + 1] if top < len(DECODE_BUCKETS) else DECODE_BUCKETS


class DraftGraphs:
    def __init__(self, runner, max_rows: int, max_chain: int, use_graphs: bool, pad: bool):
        """max_rows: the most requests a proposal drafts for (max_num_seqs at start);
        max_chain: the longest chain (k + 1 at start). Larger ones run eagerly."""
        self.runner, self.use_graphs = runner, use_graphs
        self.pad = pad or use_graphs
        self.buckets = chain_buckets(max_rows)
        self.rows = self.buckets[-1] if self.pad else max_rows
        self.max_chain = max_chain
        # padded chain lengths: a proposal's chain is k + 1 forwards (decode catch-up of
        # 2 unseen tokens), k (of 1) or k - 1 (after an extend); shorter ones (rooms cut
        # by the budget or the length cap) run padded to k - 1, so 3 graphs per bucket
        self.lengths = sorted({max(max_chain - 2, 1), max(max_chain - 1, 1), max_chain})
        n, r, w, dev = max_chain, self.rows, runner.max_blocks_per_seq, runner.device
        self.cols = torch.zeros(4 * n * r, dtype=torch.int64, device=dev)  # ids|feed|pos|slot
        self.lens = torch.ones(n * r, dtype=torch.int32, device=dev)
        self.tables = torch.zeros(r, w, dtype=torch.int32, device=dev)
        pin = dev.type == "cuda"
        self._stage = (torch.zeros(4 * n * r, dtype=torch.int64, pin_memory=pin),
                       torch.ones(n * r, dtype=torch.int32, pin_memory=pin),
                       torch.zeros(r, w, dtype=torch.int32, pin_memory=pin))
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0          # chains run through the static buffers
        self.eager_chains = 0     # chains too large for them (a live knob raised)

    def key(self, rows: int, n: int) -> tuple[int, int] | None:
        """(padded rows, n) of the buffers' forward for this chain, or None (eager)."""
        if n > self.max_chain or rows > self.rows:
            return None
        if not self.pad:
            return rows, n
        return (self.buckets[bisect.bisect_left(self.buckets, rows)],
                self.lengths[bisect.bisect_left(self.lengths, n)])

    def _views(self, size: int, n: int) -> tuple:
        cols = self.cols[:4 * n * size].view(4, n, size)
        return (*cols, self.lens[:n * size].view(n, size), self.tables[:size])

    def forward(self, ids, feed, positions, slots, lens, tables) -> torch.Tensor:
        """The chain's forwards ([n, rows] inputs, tables [rows, W]): argmaxes [n, rows]."""
        model, argmax = self.runner.model, self.runner.model.ops.argmax
        out, prev = [], None
        for f in range(ids.shape[0]):
            x = ids[f] if prev is None else torch.where(feed[f] != 0, prev, ids[f])
            meta = AttentionMetadata(slot_mapping=slots[f], num_decode_tokens=ids.shape[1],
                                     decode_block_tables=tables, decode_context_lens=lens[f])
            prev = argmax(model(x, positions[f], meta, None))
            out.append(prev)
        return torch.stack(out)

    # -- start ------------------------------------------------------------------------
    def _keys(self) -> list[tuple[int, int]]:
        """Largest first, so smaller captures reuse the pool's freed blocks."""
        return [(b, n) for b in reversed(self.buckets) for n in reversed(self.lengths)]

    def _reset(self) -> None:
        """Inputs that store nothing (slot -1), for warm-ups and captures."""
        self.cols.zero_()
        self.cols.view(4, -1)[3].fill_(-1)
        self.lens.fill_(1)

    @torch.inference_mode()
    def warm(self) -> None:
        """Eager on CUDA: run each shape once, so kernels compile at start."""
        self._reset()
        for size, n in self._keys():
            self.forward(*self._views(size, n))
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture(self) -> None:
        gc.collect()              # as StepGraphs.capture: no gc run inside a capture
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._reset()
            pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for size, n in self._keys():
                    self.forward(*self._views(size, n))       # warm up
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        out = self.forward(*self._views(size, n))
                    self.graphs[(size, n)] = (graph, out)
            torch.cuda.current_stream().wait_stream(stream)
            for graph, _ in self.graphs.values():   # first replays upload: now, not mid-serving
                graph.replay()
            torch.cuda.synchronize()
        finally:
            if enabled:
                gc.enable()

    # -- per proposal -----------------------------------------------------------------
    @torch.inference_mode()
    def run(self, chain) -> np.ndarray:
        """A DraftChain's argmaxes [rows, n] on the host (one copy)."""
        n, rows = chain.input_ids.shape
        key = self.key(rows, n)
        if key is None:
            self.eager_chains += 1
            out = self.forward(*self._eager_inputs(chain))
            return out.t().cpu().numpy()
        size, length = key
        self._fill(chain, size, length)
        self.replays += 1
        if self.use_graphs:
            graph, out = self.graphs[key]
            graph.replay()
        else:
            out = self.forward(*self._views(size, length))
        return out[:n, :rows].t().cpu().numpy()

    def _fill(self, chain, size: int, length: int) -> None:
        """Stage the chain padded to `size` rows and `length` forwards (the padding
        stores nothing) and copy it in (3 contiguous copies)."""
        n, rows = chain.input_ids.shape
        stage64, stage32, stage_tables = self._stage
        cols = stage64[:4 * length * size].numpy().reshape(4, length, size)
        lens = stage32[:length * size].numpy().reshape(length, size)
        cols[:3], cols[3], lens[:] = 0, -1, 1
        cols[0, :n, :rows], cols[1, :n, :rows] = chain.input_ids, chain.feed
        cols[2, :n, :rows], cols[3, :n, :rows] = chain.positions, chain.slot_mapping
        lens[:n, :rows] = chain.context_lens
        width = chain.block_tables.shape[1]
        stage_tables[:rows, :width].numpy()[:] = chain.block_tables
        self.cols[:4 * length * size].copy_(stage64[:4 * length * size], non_blocking=True)
        self.lens[:length * size].copy_(stage32[:length * size], non_blocking=True)
        self.tables[:rows].copy_(stage_tables[:rows], non_blocking=True)

    def _eager_inputs(self, chain) -> tuple:
        to = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a, dtype=dt)).to(  # noqa: E731
            self.runner.device)
        return (to(chain.input_ids, np.int64), to(chain.feed, np.int64),
                to(chain.positions, np.int64), to(chain.slot_mapping, np.int64),
                to(chain.context_lens, np.int32), to(chain.block_tables, np.int32))

"""KV-block residency metrics with vLLM's definitions (vllm/v1/core/kv_cache_metrics.py).

Per block: its birth (allocation) time and its last ACCESS_HISTORY prefix-cache hits.
When a cached block is evicted (reused for new content) it yields:
  lifetime          eviction - allocation
  idle_before_evict eviction - last hit (allocation if never hit)
  reuse_gap         the gaps between its consecutive recorded hits (up to 3)
vLLM samples 1% of blocks. Here a pool of up to MAX_TRACKED blocks (the CPU default's
few thousand, what a lesson watches) tracks every block; a larger one tracks one block
in `stride` by id (a GPU's 340k-block pool: ~1 in 84), because a full pool evicts on
nearly every allocation and the numpy work per eviction was a sixth of the engine's
host time. The samples go into cumulative histograms with vLLM's buckets: cheap to
copy into every snapshot, served as Prometheus histograms, and subtracted between two
snapshots for a run's percentiles. Hit counts are kept for every block (lfu reads them).
"""
from __future__ import annotations

import numpy as np

from engine.kv_metrics import (BLOCK_METRICS, RESIDENCY_BUCKETS, HistogramAccumulator,
                               KVBlockMetrics)

ACCESS_HISTORY = 4   # vLLM's deque(maxlen=4)
MAX_TRACKED = 4096   # blocks tracked in full; beyond, a 1-in-stride sample by block id


class BlockLifetimes:
    """Per-block timestamps of one pool; `now` comes from the pool's clock."""

    def __init__(self, num_blocks: int, max_tracked: int = MAX_TRACKED):
        self.stride = max(1, -(-num_blocks // max_tracked))
        self.birth = np.zeros(num_blocks)
        self.hits = np.zeros((num_blocks, ACCESS_HISTORY))   # ring of hit times
        self.num_hits = np.zeros(num_blocks, dtype=np.int64)  # hits since allocation
        self._acc = {name: HistogramAccumulator(RESIDENCY_BUCKETS) for name in BLOCK_METRICS}

    def _tracked(self, blocks: list[int]) -> list[int]:
        s = self.stride
        return blocks if s == 1 else [b for b in blocks if b % s == 0]

    def on_allocated(self, blocks: list[int], now: float) -> None:
        if len(blocks) == 1:        # a decode's next block: scalar stores, not fancy indexing
            block = blocks[0]
            self.num_hits[block] = 0
            if block % self.stride == 0:
                self.birth[block] = now
            return
        self.num_hits[blocks] = 0
        tracked = self._tracked(blocks)
        if tracked:
            self.birth[tracked] = now

    def on_hit(self, block: int, now: float) -> None:
        n = self.num_hits[block]
        self.num_hits[block] = n + 1
        if block % self.stride == 0:
            self.hits[block, n % ACCESS_HISTORY] = now

    def on_evicted(self, blocks: list[int], now: float) -> None:
        tracked = self._tracked(blocks)
        if not tracked:
            return
        idx = np.asarray(tracked)
        n = self.num_hits[idx]
        last = np.where(n > 0, self.hits[idx, (n - 1) % ACCESS_HISTORY], self.birth[idx])
        self._acc["lifetime"].add_many(now - self.birth[idx])
        self._acc["idle_before_evict"].add_many(now - last)
        self._acc["reuse_gap"].add_many(self._gaps(idx[n >= 2], n[n >= 2]))

    def _gaps(self, idx: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Consecutive differences of each block's recorded hits, oldest first."""
        if not idx.size:
            return np.zeros(0)
        k = np.minimum(n, ACCESS_HISTORY)
        order = (n[:, None] - k[:, None] + np.arange(ACCESS_HISTORY)) % ACCESS_HISTORY
        times = np.take_along_axis(self.hits[idx], order, axis=1)
        diffs = np.diff(times, axis=1)
        valid = np.arange(ACCESS_HISTORY - 1)[None, :] < (k - 1)[:, None]
        return diffs[valid]

    def freeze(self) -> KVBlockMetrics:
        return KVBlockMetrics(*(self._acc[name].freeze() for name in BLOCK_METRICS))

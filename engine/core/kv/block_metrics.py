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

import math
from dataclasses import dataclass

import numpy as np

ACCESS_HISTORY = 4   # vLLM's deque(maxlen=4)
MAX_TRACKED = 4096   # blocks tracked in full; beyond, a 1-in-stride sample by block id
# vLLM's kv_cache_residency_buckets (seconds)
RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                     10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
BLOCK_METRICS = ("lifetime", "idle_before_evict", "reuse_gap")


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: counts[i] samples <= buckets[i] and above buckets[i-1];
    the last count is above every bucket (Prometheus' +Inf)."""
    buckets: tuple[float, ...] = RESIDENCY_BUCKETS
    counts: tuple[int, ...] = (0,) * (len(RESIDENCY_BUCKETS) + 1)
    sum: float = 0.0
    count: int = 0

    def minus(self, earlier: "Histogram") -> "Histogram":
        return Histogram(self.buckets, tuple(a - b for a, b in zip(self.counts, earlier.counts)),
                         self.sum - earlier.sum, self.count - earlier.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q*count
        (the first bucket starts at 0; above the last bound: that bound)."""
        if not self.count:
            return math.nan
        rank, seen = q * self.count, 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(self.buckets):
                    return self.buckets[-1]
                lo = self.buckets[i - 1] if i else 0.0
                return lo + (self.buckets[i] - lo) * (rank - seen) / n
            seen += n
        return self.buckets[-1]


@dataclass(frozen=True)
class KVBlockMetrics:
    """The three residency histograms (a snapshot field)."""
    lifetime: Histogram = Histogram()
    idle_before_evict: Histogram = Histogram()
    reuse_gap: Histogram = Histogram()

    def minus(self, earlier: "KVBlockMetrics") -> "KVBlockMetrics":
        return KVBlockMetrics(*(getattr(self, n).minus(getattr(earlier, n)) for n in BLOCK_METRICS))

    def summary(self) -> dict:
        """count, mean and p50/p90/p99 (seconds) of each, for the bench JSON."""
        out = {}
        for name in BLOCK_METRICS:
            h = getattr(self, name)
            out[name] = {"count": h.count, "mean_s": h.mean,
                         **{f"p{q}_s": h.quantile(q / 100) for q in (50, 90, 99)}}
        return out


class _Accumulator:
    def __init__(self):
        self.counts = np.zeros(len(RESIDENCY_BUCKETS) + 1, dtype=np.int64)
        self.sum = 0.0

    def add(self, values: np.ndarray) -> None:
        if values.size:
            np.add.at(self.counts, np.searchsorted(RESIDENCY_BUCKETS, values, side="left"), 1)
            self.sum += float(values.sum())

    def freeze(self) -> Histogram:
        return Histogram(RESIDENCY_BUCKETS, tuple(int(c) for c in self.counts), self.sum,
                         int(self.counts.sum()))


class BlockLifetimes:
    """Per-block timestamps of one pool; `now` comes from the pool's clock."""

    def __init__(self, num_blocks: int, max_tracked: int = MAX_TRACKED):
        self.stride = max(1, -(-num_blocks // max_tracked))
        self.birth = np.zeros(num_blocks)
        self.hits = np.zeros((num_blocks, ACCESS_HISTORY))   # ring of hit times
        self.num_hits = np.zeros(num_blocks, dtype=np.int64)  # hits since allocation
        self._acc = {name: _Accumulator() for name in BLOCK_METRICS}

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
        self._acc["lifetime"].add(now - self.birth[idx])
        self._acc["idle_before_evict"].add(now - last)
        self._acc["reuse_gap"].add(self._gaps(idx[n >= 2], n[n >= 2]))

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

"""KV-block residency histograms as plain data (vLLM's buckets and names): what the
core's BlockLifetimes (engine/core/kv/block_metrics.py) freezes into every snapshot and
EngineStats, and what /metrics and the bench read; HistogramAccumulator fills one of
other buckets sample by sample (EngineStats.iteration_tokens)."""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

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


class HistogramAccumulator:
    """A Histogram being filled: one sample at a time (a hot path's: a bisect, no numpy),
    or an array of them (`add_many`: a step's freed blocks)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def add_many(self, values) -> None:
        """`values`: a numpy array (the same bucket rule: the first bound >= the value)."""
        if values.size:
            at, n = np.unique(np.searchsorted(self.buckets, values, side="left"),
                              return_counts=True)
            for i, count in zip(at.tolist(), n.tolist()):
                self.counts[i] += count
            self.sum += float(values.sum())

    def freeze(self) -> Histogram:
        return Histogram(self.buckets, tuple(self.counts), self.sum, sum(self.counts))


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

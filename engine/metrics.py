"""Latency statistics with vLLM's serving-benchmark definitions.

TTFT = first token - arrival; TPOT = (last - first) / (n - 1) for n > 1;
ITL = every gap between consecutive tokens, pooled; E2E = last token - arrival.
Percentiles interpolate linearly between order statistics (numpy's default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

PERCENTILES = (50, 95, 99)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear-interpolated percentiles (0..100) of values, numpy's default method (the
    one percentile function: reports, the TUI's timing panel)."""
    if not len(values):
        return [math.nan] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), qs)]


def percentile(values: Sequence[float], q: float) -> float:
    return percentiles(values, (q,))[0]


def request_latencies(arrival: float, times: Sequence[float]
                      ) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, last ITL) of one request from its token times: the one place these
    formulas live (RequestMetrics, request views and the stats recorder use it)."""
    if not times:
        return None, None, None
    n = len(times)
    if n == 1:
        return times[0] - arrival, None, None
    return times[0] - arrival, (times[-1] - times[0]) / (n - 1), times[-1] - times[-2]


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> "Summary":
        xs = [v for v in values if v is not None]
        if not xs:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        p50, p95, p99 = percentiles(xs, PERCENTILES)
        return cls(len(xs), sum(xs) / len(xs), p50, p95, p99, max(xs))


def summarize_requests(metrics) -> dict[str, Summary]:
    """TTFT/TPOT/ITL/E2E summaries over RequestMetrics objects."""
    metrics = list(metrics)
    return {
        "ttft": Summary.of(m.ttft for m in metrics),
        "tpot": Summary.of(m.tpot for m in metrics),
        "itl": Summary.of(x for m in metrics for x in m.itls),
        "e2e": Summary.of(m.e2e for m in metrics),
    }

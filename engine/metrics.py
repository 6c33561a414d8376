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


def prefix_hit_rate(hit_tokens: int, queried_tokens: int) -> float | None:
    """Prefix-cache hit rate over a span: prompt tokens found cached / prompt tokens looked
    up (vLLM's prefix_cache_hits / prefix_cache_queries); None when nothing was looked up
    (the one formula: bench reports, the TUI's counters and charts, guide checks)."""
    return hit_tokens / queried_tokens if queried_tokens else None


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


# -- goodput (vLLM's --goodput, after DistServe) -------------------------------------------
SLO_METRICS = ("ttft", "tpot", "e2el")     # vLLM's names: e2el = end-to-end latency


def parse_slos(specs: Iterable[str]) -> dict[str, float]:
    """["ttft:200", "tpot:50"] -> {"ttft": 200.0, "tpot": 50.0} (milliseconds), as vLLM's
    `--goodput KEY:VALUE ...`; ValueError on an unknown metric or a value that is not > 0."""
    slos: dict[str, float] = {}
    for spec in specs:
        name, sep, value = str(spec).partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"goodput SLO {spec!r}: expected one of "
                             f"{', '.join(m + ':MS' for m in SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {spec!r}: {value!r} is not a number") from None
        if not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"goodput SLO {spec!r}: the value must be > 0 ms")
        slos[name] = ms
    return slos


def meets_slos(ttft: float | None, tpot: float | None, e2el: float | None,
               slos: dict[str, float]) -> bool:
    """Whether one request (latencies in seconds) meets every SLO (ms) given. A request
    with one output token has no TPOT and meets a TPOT SLO (vLLM counts its TPOT as 0);
    a request with no token at all (no TTFT) meets none."""
    if ttft is None:
        return False
    values = {"ttft": ttft, "tpot": tpot or 0.0, "e2el": e2el if e2el is not None else math.inf}
    return all(values[name] * 1000.0 <= ms for name, ms in slos.items())


def goodput(requests: Iterable[tuple[float | None, float | None, float | None]],
            slos: dict[str, float], duration: float) -> tuple[int, float]:
    """(requests meeting every SLO, those per second of `duration`): vLLM's request
    goodput (benchmark_serving's --goodput). `requests` are (ttft, tpot, e2el) in seconds."""
    good = sum(meets_slos(t, p, e, slos) for t, p, e in requests)
    return good, good / duration if duration > 0 else math.nan

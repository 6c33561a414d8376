"""Latency figures the timing panels draw: percentiles, the p50 of the latest requests,
a finished request's TTFT / TPOT / E2EL and the goodput share (engine/metrics.py's
definitions)."""
from __future__ import annotations

import math

from engine.metrics import meets_slos, percentiles

RECENT = 16           # requests behind each plotted p50 (the latest to get a first token)


def pctl(values, qs=(50, 95, 99)) -> list[float | None]:
    return [None] * len(qs) if not len(values) else percentiles(values, qs)


def recent_p50(requests, field: str, since: float = -math.inf) -> float:
    """p50 of `field` over the RECENT requests that have it (latest first token first),
    those whose first token came after `since` (the plots' reset): a continuous curve
    even when requests finish in waves."""
    have = [r for r in requests if getattr(r, field) is not None
            and r.arrival_time + (r.ttft or 0.0) >= since]
    have.sort(key=lambda r: r.arrival_time + (r.ttft or 0.0))
    values = [getattr(r, field) for r in have[-RECENT:]]
    return pctl(values, (50,))[0] if values else math.nan


def view_latencies(view) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, E2EL) of a finished request view: last token - arrival is
    TTFT + TPOT x (n - 1) by the definitions in engine/metrics.py."""
    e2el = None
    if view.ttft is not None:
        e2el = view.ttft + (view.tpot or 0.0) * max(0, view.output_tokens - 1)
    return view.ttft, view.tpot, e2el


def goodput_share(snap, start: float, slos: dict, requests=None) -> tuple[int, int]:
    """(requests meeting every SLO, requests finished) among the finished requests in
    the snapshot (or `requests`: CounterWindow.requests, with those it let go of) whose
    last token came after `start` (engine time)."""
    good = total = 0
    for view in (snap.requests if requests is None else requests):
        if view.state != "finished" or view.ttft is None:
            continue
        lat = view_latencies(view)
        if view.arrival_time + lat[2] < start:
            continue
        total += 1
        good += meets_slos(*lat, slos)
    return good, total


def slo_text(slos: dict) -> str:
    """"ttft≤200 tpot≤50" (ms), as typed after --goodput."""
    return " ".join(f"{k}≤{v:g}" for k, v in slos.items())


def window_firsts(requests, start: float) -> list:
    """The requests whose first token came at or after `start` (engine time): the Timing
    table's TTFT row, its split line's, the TTFT plot's and the compare table's population."""
    return [r for r in requests if r.ttft is not None and r.arrival_time + r.ttft >= start]


def window_ttfts(requests, start: float) -> list[float]:
    """TTFT of `window_firsts`."""
    return [r.ttft for r in window_firsts(requests, start)]

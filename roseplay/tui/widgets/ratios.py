"""The compare view's table: each metric on side A, side B, and the ratio B/A.

The metrics are those of the timing and KV panels over the same last-10-s window
(roseplay/tui/widgets/counters.py), so the table and the panels above it never disagree.
A ratio is green where B is better, red where it is worse (by the metric's direction),
dim within 5 %. Columns that do not fit the width are dropped from the right (the
order below is the order of importance) and the border says how many.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from rich.text import Text
from textual.widget import Widget

from roseplay.tui.widgets.counters import WINDOW
from roseplay.tui.widgets.latency import goodput_share, pctl, window_ttfts
from roseplay.tui.widgets.requests import fmt_ms

LABEL_WIDTH, COLUMN_WIDTH = 6, 10
SAME = 0.05            # |ratio - 1| under this reads as "the same"


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    fmt: Callable[[float], str]
    higher_is_better: bool


def _num(v: float) -> str:
    return f"{v:,.0f}"


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


METRICS = (
    Metric("ttft_p50", "TTFT p50", fmt_ms, False),
    Metric("tpot_p50", "TPOT p50", fmt_ms, False),
    Metric("tput", "tok/s", _num, True),
    Metric("goodput", "goodput", _pct, True),
    Metric("hit", "hit rate", _pct, True),
    Metric("preempt", "preempt", _num, False),
    Metric("ttft_p95", "TTFT p95", fmt_ms, False),
    Metric("itl_p50", "ITL p50", fmt_ms, False),
    Metric("done", "req done", _num, True),
    Metric("kv_used", "KV now", _num, False),     # blocks in use now (not over 10 s)
    Metric("steps", "steps", _num, True),
)


NOW_METRICS = ("tput", "kv_used", "steps")     # what a stopped engine has none of now


def side_metrics(snap, window, slos: dict, stopped: bool = False) -> dict[str, float]:
    """One side's numbers over the last WINDOW s (since the reset, if later); NaN where
    there is no data yet (no finished request, no SLO set), and where a side whose
    engine stopped for good has no figure of now (tok/s, KV in use, steps)."""
    start = max(snap.time - WINDOW, window.since if window.since is not None else -math.inf)
    lat = [x for x in snap.recent_latencies if x[0] >= start]
    requests = window.requests(snap)      # (with the window's finished the snapshot let go)
    ttft = window_ttfts(requests, start)      # the Timing table's population
    tpot = [x[2] for x in lat if x[2] is not None]
    itl = [x[1] for x in window.itls() if x[0] >= start]    # (the window keeps them all)
    t50, t95 = pctl(ttft, (50, 95))
    good, total = goodput_share(snap, start, slos, requests) if slos else (0, 0)
    hit = window.hit_rate(recent=True)
    if hit is None and not snap.knobs.enable_prefix_caching:
        hit = 0.0     # no lookup, nothing reused: the hit plot's 0 (the cell read "-")
    nan = math.nan
    tok_rate = _or_nan(window.rate("generated_tokens"))
    out = {"ttft_p50": _or_nan(t50), "ttft_p95": _or_nan(t95),
           "tpot_p50": _or_nan(pctl(tpot, (50,))[0]), "itl_p50": _or_nan(pctl(itl, (50,))[0]),
           "tput": tok_rate, "goodput": good / total if total else nan,
           "hit": nan if hit is None else hit, "preempt": window.recent("preemptions"),
           "done": len(lat), "kv_used": snap.num_used, "steps": window.recent("steps")}
    return (out | dict.fromkeys(NOW_METRICS, nan)) if stopped else out


def _or_nan(v) -> float:
    return math.nan if v is None else float(v)


def ratio(b: float, a: float) -> float:
    if any(isinstance(x, float) and math.isnan(x) for x in (a, b)):
        return math.nan
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


class RatioTable(Widget):
    """Rows A, B and B/A; one column per metric that fits."""

    DEFAULT_CSS = "RatioTable { height: 4; text-wrap: nowrap; }"

    def __init__(self, labels=("A", "B"), **kwargs):
        super().__init__(**kwargs)
        self.labels = labels
        self._text = Text()
        self.shown = len(METRICS)

    def columns(self) -> int:
        width = self.size.width or 120
        return max(1, min(len(METRICS), (width - LABEL_WIDTH) // COLUMN_WIDTH))

    def show(self, a: dict, b: dict) -> None:
        metrics = METRICS[:self.columns()]
        self.shown = len(metrics)
        t = Text(no_wrap=True)
        t.append(" " * LABEL_WIDTH + "".join(f"{m.title:>{COLUMN_WIDTH}}" for m in metrics)
                 + "\n", "bold #aab2c0")
        for label, side, color in ((self.labels[0], a, "#5fb3f0"), (self.labels[1], b, "#c792ea")):
            t.append(f"{label:<{LABEL_WIDTH}}", f"bold {color}")
            t.append("".join(f"{_fmt(m, side[m.key]):>{COLUMN_WIDTH}}" for m in metrics) + "\n")
        t.append(f"{'B/A':<{LABEL_WIDTH}}", "bold #f2d34f")
        for m in metrics:
            r = ratio(b[m.key], a[m.key])
            t.append(f"{_fmt_ratio(r):>{COLUMN_WIDTH}}", _ratio_style(r, m.higher_is_better))
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text


def _fmt(m: Metric, v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return m.fmt(v)


def _fmt_ratio(r: float) -> str:
    if math.isnan(r):
        return "-"
    if math.isinf(r):
        return "×∞"
    return f"×{r:.2f}" if r < 100 else f"×{r:,.0f}"


def _ratio_style(r: float, higher_is_better: bool) -> str:
    if math.isnan(r) or abs(r - 1) < SAME:
        return "dim"
    better = (r > 1) == higher_is_better
    return "bold #4cc97a" if better else "bold #ff6b6b"

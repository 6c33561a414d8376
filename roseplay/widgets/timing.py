"""Timing: TTFT / TPOT / ITL percentiles, throughput, and plots over time.

`TimingHistory` turns successive snapshots into one point per `BUCKET` seconds of
engine time (p50 TTFT of the `RECENT` latest requests to get a first token, p50 TPOT of
the `RECENT` latest to finish, output tokens per second), so a knob change shows up as a
step in the curves without gaps when requests finish in waves. `Plot` draws a
series as eighth-block bars over a few rows with the Line API.
"""
from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.containers import Horizontal, Vertical
from textual.strip import Strip
from textual.widget import Widget

from roseplay.widgets.requests import fmt_ms

BUCKET = 0.5          # seconds of engine time per plotted point
WINDOW = 10.0         # seconds of recent samples behind the percentiles
HISTORY = 240
RECENT = 16           # requests behind each plotted p50 (the latest to get a first token)
UPDATE_EVERY = 0.5   # seconds between redraws (the text changes every frame otherwise)
_EIGHTHS = " ▁▂▃▄▅▆▇█"


def pctl(values, qs=(50, 95, 99)) -> list[float | None]:
    if not len(values):
        return [None] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), qs)]


def recent_p50(requests, field: str) -> float:
    """p50 of `field` over the RECENT requests that have it (latest first token first):
    a continuous curve even when requests finish in waves."""
    have = [r for r in requests if getattr(r, field) is not None]
    have.sort(key=lambda r: r.arrival_time + (r.ttft or 0.0))
    values = [getattr(r, field) for r in have[-RECENT:]]
    return pctl(values, (50,))[0] if values else math.nan


class TimingHistory:
    """Bucketed series computed from snapshots (resets if time goes backwards)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.series = {k: deque(maxlen=HISTORY) for k in ("ttft", "tpot", "tput")}
        self._t = None
        self._tokens = 0
        self.rate = 0.0          # output tokens / s over the last few buckets
        self._recent: deque = deque(maxlen=4)

    def feed(self, snap) -> None:
        now, tokens = snap.time, snap.counters.generated_tokens
        if self._t is not None and (now < self._t or tokens < self._tokens):
            self.reset()
        if self._t is None:
            self._t, self._tokens = now, tokens
            return
        if now - self._t < BUCKET:
            return
        dt, dtok = now - self._t, tokens - self._tokens
        self.series["ttft"].append(recent_p50(snap.requests, "ttft"))
        tpots = [x[2] for x in snap.recent_latencies[-4 * RECENT:] if x[2] is not None]
        self.series["tpot"].append(pctl(tpots[-RECENT:], (50,))[0] if tpots else math.nan)
        self.series["tput"].append(dtok / dt)
        self._recent.append((dt, dtok))
        self.rate = sum(b for _, b in self._recent) / max(1e-9, sum(a for a, _ in self._recent))
        self._t, self._tokens = now, tokens


class Plot(Widget):
    """A series as bars (Line API); the label column shows name, latest value and max."""

    DEFAULT_CSS = "Plot { height: 3; }"
    LABEL = 14

    def __init__(self, name: str, color: str, fmt, **kwargs):
        super().__init__(**kwargs)
        self.label, self.color, self.fmt = name, color, fmt
        self.values: list[float] = []
        self._key = None

    def show(self, values) -> None:
        values = list(values)
        if values != self.values:
            self.values = values
            self.refresh()

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        n = max(0, width - self.LABEL)
        vals = self.values[-n:] if n else []
        finite = [v for v in vals if not math.isnan(v)]
        top = max(finite) if finite else 0.0
        label = self._label(y, vals, top)
        segments = [Segment(label.ljust(self.LABEL)[:self.LABEL], self._label_style(y))]
        style = Style(color=self.color, bgcolor="#1d2027")
        chars = []
        for v in vals:
            if math.isnan(v) or top <= 0:
                chars.append(" ")
                continue
            eighths = round(v / top * height * 8) - (height - 1 - y) * 8
            chars.append(_EIGHTHS[max(0, min(8, eighths))])
        segments.append(Segment("".join(chars).rjust(n), style))
        return Strip(segments).adjust_cell_length(width)

    def _label(self, y: int, vals, top: float) -> str:
        last = next((v for v in reversed(vals) if not math.isnan(v)), None)
        if y == 0:
            return self.label
        if y == 1:
            return f" {self.fmt(last)}" if last is not None else " -"
        return f" max {self.fmt(top)}" if y == 2 and vals else ""

    def _label_style(self, y: int) -> Style:
        return Style(color=self.color, bold=True) if y < 2 else Style(dim=True)


class TimingStats(Widget):
    DEFAULT_CSS = "TimingStats { width: 36; height: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()

    def show(self, snap, rate: float) -> None:
        t = Text(no_wrap=True)
        t.append(f"{'':6}{'p50':>9}{'p95':>9}{'p99':>9}\n", "bold #aab2c0")
        since = snap.time - WINDOW
        lat = [x for x in snap.recent_latencies if x[0] >= since] or list(snap.recent_latencies)
        itl = [x[1] for x in snap.recent_itls if x[0] >= since] or [x[1] for x in snap.recent_itls]
        rows = (("TTFT", [x[1] for x in lat], "#f2c14e"),
                ("TPOT", [x[2] for x in lat if x[2] is not None], "#4cc97a"),
                ("ITL", itl, "#5fb3f0"))
        for name, values, color in rows:
            t.append(f"{name:<6}", f"bold {color}")
            t.append("".join(f"{fmt_ms(v):>9}" for v in pctl(values)) + "\n")
        c = snap.counters
        t.append(f"{rate:8.0f} tok/s ", "bold")
        t.append(f" {c.generated_tokens} tokens out\n")
        t.append(f"finished {c.finished}  errors {c.errors}  cancelled {c.cancelled}\n")
        t.append(f"last {WINDOW:.0f} s: {len(lat)} requests, {len(itl)} gaps", "dim")
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text


class TimingPanel(Horizontal):
    DEFAULT_CSS = "TimingPanel { height: 11; } TimingPanel > Vertical { width: 1fr; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.history = TimingHistory()
        self._shown_at = (None, -1.0)     # (snapshot time, monotonic) of the last redraw
        self._make_children()

    def compose(self):
        yield self.stats
        with Vertical():
            yield from self.plots.values()

    def _make_children(self) -> None:
        self.stats = TimingStats()
        self.plots = {"ttft": Plot("TTFT p50", "#f2c14e", fmt_ms, id="plot-ttft"),
                      "tpot": Plot("TPOT p50", "#4cc97a", fmt_ms, id="plot-tpot"),
                      "tput": Plot("tokens/s", "#5fb3f0", lambda v: f"{v:,.0f}", id="plot-tput")}

    def show(self, snap, throttle: bool = True) -> None:
        """Feed the history every frame; redraw on a new snapshot, at most every
        UPDATE_EVERY seconds while `throttle` (a running engine: text changes every frame)."""
        self.history.feed(snap)
        last_time, last_mono = self._shown_at
        now = time.monotonic()
        if snap.time == last_time or (throttle and now - last_mono < UPDATE_EVERY):
            return
        self._shown_at = (snap.time, now)
        self.stats.show(snap, self.history.rate)
        for key, plot in self.plots.items():
            plot.show(self.history.series[key])

"""Timing: TTFT / TPOT / ITL percentiles, throughput, and plots over time.

`TimingHistory` turns successive snapshots into one point per `BUCKET` seconds of
engine time (p50 TTFT of the `RECENT` latest requests to get a first token, p50 TPOT of
the `RECENT` latest to finish, output tokens per second), so a knob change shows up as a
step in the curves without gaps when requests finish in waves; roseplay/tui/widgets/plots.py
draws them. Latencies are the engine's (paused time is excluded there, by its serving
clock).
"""
from __future__ import annotations

import math
import time
from collections import deque
from functools import partial

from rich.text import Text
from textual.containers import Container, Vertical
from textual.css.query import NoMatches
from textual.widget import Widget

from engine.metrics import prefix_hit_rate
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.borders import WidthBorders
from roseplay.tui.widgets.counters import WINDOW
from roseplay.tui.widgets.plots import (BUCKET, MARK_BG, PLOT_BG, Plot,  # noqa: F401
                                        TimeAxis, place_labels, scale_top)
from roseplay.tui.widgets.latency import (RECENT, goodput_share, pctl,  # noqa: F401
                                          recent_p50, slo_text, view_latencies, window_ttfts)
from roseplay.tui.widgets.requests import fmt_ms
from roseplay.tui.widgets.spec_note import SpecNote
from roseplay.tui.widgets.stopped import BLANK, caption_borders
from roseplay.tui.widgets.ttft_split import window_split

HISTORY = 240
UPDATE_EVERY = 0.5   # seconds between redraws (the text changes every frame otherwise)


SERIES = ("ttft", "itl", "tput", "running", "waiting", "kv", "hit", "tpot", "accept", "alen")
SPEC_PLOTS = ("accept", "alen")     # shown while speculative decoding is (or was just) on


class TimingHistory:
    """Bucketed series computed from snapshots (resets if time goes backwards), and the
    knob changes as marks on the bucket they happened in."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.series = {k: deque(maxlen=HISTORY) for k in SERIES}
        self.marks: deque = deque(maxlen=HISTORY)     # per point: a knob change's label or None
        self._pending: deque = deque()     # changes not yet on a point, oldest first
        self._t = None
        self._since = -math.inf      # first tokens before the reset stay out of the curve
        self._tokens = 0
        self._counters = None

    def mark(self, label: str) -> None:
        """A knob changed: the next point without a mark carries `label` (two changes
        within one bucket land on two points, in order: none is lost)."""
        self._pending.append(label)

    def _take_mark(self, final: bool) -> str | None:
        """The oldest waiting change, or on the last point all of them (none is lost)."""
        if not self._pending:
            return None
        if not final:
            return self._pending.popleft()
        label = " · ".join(self._pending)
        self._pending.clear()
        return label

    def feed(self, snap, final: bool = False) -> None:
        """A point per BUCKET of engine time; `final` (no later frame comes: a replay's
        last) makes the part bucket a point too while a change waits for one."""
        now, tokens = snap.time, snap.counters.generated_tokens
        if self._t is not None and (now < self._t or tokens < self._tokens):
            self.reset()
        if self._t is None:
            self._t, self._tokens, self._counters = now, tokens, snap.counters
            self._since = now
            return
        if now - self._t < BUCKET and not (final and self._pending and now > self._t):
            return
        dt, dtok = now - self._t, tokens - self._tokens
        add = {k: s.append for k, s in self.series.items()}
        add["ttft"](recent_p50(snap.requests, "ttft", self._since))
        tpots = [x[2] for x in snap.recent_latencies[-4 * RECENT:] if x[2] is not None]
        add["tpot"](pctl(tpots[-RECENT:], (50,))[0] if tpots else math.nan)
        gaps = [g for t, g in snap.recent_itls if t > self._t]
        add["itl"](pctl(gaps, (50,))[0] if gaps else math.nan)
        add["tput"](dtok / dt)
        step = snap.last_step
        add["running"](step.num_running if step else 0)
        add["waiting"](step.num_waiting if step else 0)
        add["kv"](100.0 * snap.num_used / max(1, snap.num_blocks))
        a, b = self._counters, snap.counters
        rate = prefix_hit_rate(b.prefix_hit_tokens - a.prefix_hit_tokens,
                               b.prefix_queried_tokens - a.prefix_queried_tokens)
        off = not snap.knobs.enable_prefix_caching      # no lookups at all: nothing hits
        add["hit"](100.0 * rate if rate is not None else 0.0 if off else math.nan)
        accept, length = b.spec_acceptance(a)
        add["accept"](100.0 * accept)
        add["alen"](length)
        self.marks.append(self._take_mark(final))
        self._t, self._tokens, self._counters = now, tokens, snap.counters


class TimingStats(Widget):
    DEFAULT_CSS = ("TimingStats { width: 34; height: 6; text-wrap: nowrap; "
                   "text-overflow: ellipsis; }")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()

    def show(self, snap, rate: float | None, since: float | None, slos: dict | None = None,
             stopped: bool = False, requests=None, itls=None) -> None:
        """Percentiles over the last WINDOW seconds (from the last reset or knob change,
        if later; the header says how many): TTFT of the requests whose first token came
        in it (the TTFT plot's population: its points are the p50 of the RECENT latest),
        TPOT of those that finished in it, every token gap in it; with SLOs, the share of
        the requests finished then that met all of them (goodput). `stopped`: the engine
        stopped for good: the window ends at its stop, and no token comes now (no tok/s)."""
        start = max(snap.time - WINDOW, since if since is not None else -math.inf)
        lat = [x for x in snap.recent_latencies if x[0] >= start]
        itl = [x[1] for x in (snap.recent_itls if itls is None else itls) if x[0] >= start]
        requests = snap.requests if requests is None else requests   # (with the window's
        ttft = window_ttfts(requests, start)                          # finished let go of)
        t = Text(no_wrap=True)
        span = f"{min(WINDOW, snap.time - start):.0f} s"
        t.append(f"{span:<6}{'p50':>9}{'p95':>9}{'p99':>9}\n", "bold #aab2c0")
        rows = (("TTFT", ttft, "prefill"),
                ("TPOT", [x[2] for x in lat if x[2] is not None], "decode"),
                ("ITL", itl, "tput"))
        for name, values, color in rows:
            t.append(f"{name:<6}", f"bold {theme.color(color)}")
            t.append("".join(f"{fmt_ms(v):>9}" for v in pctl(values)) + "\n")
            if name == "TTFT":          # where its time went (roseplay/tui/widgets/ttft_split.py)
                t.append_text(window_split(requests, start))
                t.append("\n")
        t.append(f"{BLANK} tok/s" if stopped else "- tok/s" if rate is None else
                 f"{rate:,.0f} tok/s", "bold")
        if slos:
            good, total = goodput_share(snap, start, slos, requests)
            t.append(" · good ", "dim")
            t.append(f"{100 * good / total:.0f}%" if total else "-", f"bold {theme.color('tput')}")
            t.append(f" of {total}", "dim")
        else:
            t.append(f" · {len(lat)} req done", "dim")
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text


class TimingPanel(WidthBorders, Container):
    """The table, and the plots beside it (`-side`), under it (`-stacked`) or hidden."""

    DEFAULT_CSS = """
    TimingPanel { height: 9; layout: horizontal; }
    TimingPanel.-stacked { layout: vertical; }
    TimingPanel.-stacked TimingStats { width: 1fr; }
    TimingPanel.-stats #plots { display: none; }
    TimingPanel #plots { width: 1fr; height: 1fr; overflow: hidden; }
    TimingPanel.-side #plots { margin-left: 2; }
    """
    MODES = ("side", "stacked", "stats")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.history = TimingHistory()
        self._shown_at = (None, -1.0)     # ((snapshot time, stop), monotonic) last drawn
        self.stats = TimingStats()
        count = lambda v: f"{v:.0f}"          # noqa: E731
        pct = lambda v: f"{v:.0f}%"           # noqa: E731
        # most needed first: the plots that do not fit the panel's height are cut (the
        # speculation plots, shown while it is on, come before the queue's: guide d asks
        # for them, and at 120x40 they came last and were cut)
        self.plots = {"ttft": Plot("TTFT", "prefill", fmt_ms, id="plot-ttft"),
                      "itl": Plot("ITL", "decode", fmt_ms, id="plot-itl"),
                      "tput": Plot("tok/s", "tput", lambda v: f"{v:,.0f}", id="plot-tput"),
                      "accept": Plot("accepted", "decode", pct, 100.0, id="plot-accept"),
                      "alen": Plot("accept len", "tput", lambda v: f"{v:.2f}",
                                   id="plot-alen"),
                      "running": Plot("running", "used", count, id="plot-running"),
                      "waiting": Plot("waiting", "preempt", count, id="plot-waiting"),
                      "kv": Plot("KV used", "shared", pct, 100.0, id="plot-kv"),
                      "hit": Plot("hit rate", "cached", pct, 100.0, id="plot-hit")}
        for key in SPEC_PLOTS:
            self.plots[key].display = False
        self.axis = TimeAxis()
        self.spec_note = SpecNote(id="spec-note")    # under the ITL plot: why it is bursty
        self.mode = "side"
        self.add_class("-side")
        self.slos: dict[str, float] = {}      # goodput SLOs (ms), set from the app

    def compose(self):
        yield self.stats
        with Vertical(id="plots"):
            yield self.axis
            for key, plot in self.plots.items():
                yield plot
                if key == "itl":
                    yield self.spec_note

    def set_mode(self, mode: str) -> None:
        if mode != self.mode:
            self.remove_class(f"-{self.mode}")
            self.mode = mode
            self.add_class(f"-{mode}")
        self.call_after_refresh(self.size_plots)

    def reset(self) -> None:
        self.history.reset()
        self.reset_shown()

    def reset_shown(self) -> None:
        """Redraw at the next show() (a setting changed, not the data)."""
        self._shown_at = (None, -1.0)

    def show(self, snap, window, throttle: bool = True, final: bool = False,
             stopped_at: int | None = None, hold: bool = False) -> None:
        """Feed the history every frame (`final`: no later frame comes); redraw on a new
        snapshot, at most every UPDATE_EVERY seconds while `throttle` (a running engine:
        text changes every frame), never while `hold` (the compare screen redraws both
        sides and its table in one frame). `stopped_at`: the step the engine stopped
        after (None while it serves): drawn at once, as the last figures before the
        stop, captioned."""
        self.history.feed(snap, final)
        last_key, last_mono = self._shown_at
        now, key, stopped = time.monotonic(), (snap.time, stopped_at), stopped_at is not None
        if key == last_key or (not stopped and (hold or (
                throttle and now - last_mono < UPDATE_EVERY))):
            return
        self._shown_at = (key, now)
        self.stats.show(snap, window.rate("generated_tokens"), window.since, self.slos, stopped,
                        window.requests(snap), window.itls())
        goodput = f"goodput: {slo_text(self.slos)} (l edits)" if self.slos else ""
        self.set_borders(partial(caption_borders, stopped_at, goodput))
        marks = self.history.marks
        self._show_spec_plots(snap)
        since = window.reset_time
        self.spec_note.show(snap, max(snap.time - WINDOW,
                                      since if since is not None else -math.inf), window)
        for name, plot in self.plots.items():
            plot.show(self.history.series[name], marks, stopped)
        self.axis.show(marks, stopped)

    def _show_spec_plots(self, snap) -> None:
        """The speculation plots take rows only once speculation is on (or its points
        are still in the window): off, they would be two rows of `-`."""
        on = snap.knobs.num_speculative_tokens > 0 or any(
            not math.isnan(v) for v in self.history.series["accept"])
        for key in SPEC_PLOTS:
            if self.plots[key].display != on:
                self.plots[key].display = on
                self.size_plots()

    def on_resize(self) -> None:
        self.size_plots()

    def size_plots(self) -> None:
        """Spare rows (a zoomed or tall panel) make every plot taller, not blank below:
        each gets the same share of the rows under the time axis (at least one). Before
        the panel's children are mounted (the app's timer can show a snapshot first)
        there is nothing to size: its first resize does it."""
        try:
            box = self.query_one("#plots")
        except NoMatches:
            return
        shown = [p for p in self.plots.values() if p.display]
        rows = box.size.height - 1
        height = max(1, rows // max(1, len(shown))) if rows > 0 else 1
        for plot in shown:
            if plot.styles.height is None or plot.styles.height.value != height:
                plot.styles.height = height

    def mark(self, label: str) -> None:
        """A knob changed now: a mark and its label on every plot."""
        self.history.mark(label)

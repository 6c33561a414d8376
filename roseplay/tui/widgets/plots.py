"""The Timing panel's plots: a series as eighth-block bars (`Plot`), and the time axis
under them with the knob changes' labels (`TimeAxis`); one point per BUCKET seconds of
engine time (roseplay/tui/widgets/timing.py TimingHistory makes them)."""
from __future__ import annotations

import math

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from roseplay.tui.widgets import theme
from roseplay.tui.widgets.stopped import BLANK

BUCKET = 0.5          # seconds of engine time per plotted point
_EIGHTHS = " ▁▂▃▄▅▆▇█"
PLOT_BG, MARK_BG = "#1d2027", "#5a4a10"    # a plot's ground; the column of a knob change


class Plot(Widget):
    """A series as eighth-block bars (Line API) beside a label column: the name with the
    latest value (units included), and the top of the scale. The scale ignores rare
    outliers (a bar above it is drawn full with a ▲), so one slow request does not
    flatten the curve for minutes."""

    DEFAULT_CSS = "Plot { height: 1; }"
    LABEL = 19          # "TTFT 23.9ms/24.4ms" and the blank before the bars

    def __init__(self, name: str, color_key: str, fmt, fixed_top: float | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.label, self.color_key, self.fmt = name, color_key, fmt
        self.fixed_top = fixed_top      # a fixed full scale (percentages: 100)
        self.values: list[float] = []
        self.marks: list = []
        self.stopped = False      # the engine stopped: the latest point is not now

    def show(self, values, marks=(), stopped: bool = False) -> None:
        values, marks = list(values), list(marks)
        if values != self.values or marks != self.marks or stopped != self.stopped:
            self.values, self.marks, self.stopped = values, marks, stopped
            self.refresh()

    def points(self) -> int:
        return max(0, self.size.width - self.LABEL)

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        n = self.points()
        vals = self.values[-n:] if n else []
        marks = self.marks[-len(vals):] if vals else []
        finite = [v for v in vals if not math.isnan(v)]
        top = self.fixed_top or scale_top(finite)
        color = theme.color(self.color_key)
        segments = [Segment(self._label(y, height, finite, top).ljust(self.LABEL)[:self.LABEL],
                            Style(color=color, bold=y == 0))]
        if len(vals) < n:
            segments.append(Segment(" " * (n - len(vals)), Style(bgcolor=PLOT_BG)))
        plain, marked = Style(color=color, bgcolor=PLOT_BG), Style(color=color, bgcolor=MARK_BG)
        for i, v in enumerate(vals):
            if math.isnan(v) or top <= 0:
                char = " "
            elif v > top:
                char = "▲" if y == 0 else "█"
            else:
                # a value above 0 keeps one eighth: drawn blank, 8 ms under a 1453 ms
                # scale looked like a point with no data
                total = max(1, round(v / top * height * 8)) if v > 0 else 0
                eighths = total - (height - 1 - y) * 8
                char = _EIGHTHS[max(0, min(8, eighths))]
            # a knob change: a column of its own background down every plot
            segments.append(Segment(char, marked if i < len(marks) and marks[i] else plain))
        return Strip(Segment.simplify(segments)).adjust_cell_length(width)

    def _label(self, y: int, height: int, finite, top: float) -> str:
        """Name and latest value (units included); the full scale on the second row, or
        after a slash on a one-row plot. Once the engine stopped, a blank in place of the
        latest value (the bars end at the stop; a one-row plot keeps its scale). The scale
        goes only where a blank is left before the bars (`TTFT 1179ms/1792ms▄▄` ran into
        them)."""
        if y == 0 and self.stopped and finite:
            text, scale = f"{self.label} {BLANK}", f" top {self.fmt(top)}"
            return text + (scale if height == 1 and top > 0 and
                           len(text + scale) < self.LABEL else "")
        if y == 0:      # the latest point's value ("-": none in it, not an older one)
            if not finite or math.isnan(self.values[-1]):
                return f"{self.label} -"
            text = f"{self.label} {self.fmt(finite[-1])}"
            return text + (f"/{self.fmt(top)}" if height == 1 and top > 0 and
                           len(text) + 1 + len(self.fmt(top)) < self.LABEL else "")
        if y == 1:
            return f" top {self.fmt(top)}" if finite else " no data yet"
        return ""


def scale_top(finite) -> float:
    """The plot's full scale: the max, unless a few outliers sit far above the rest."""
    if not finite:
        return 0.0
    top, p90 = max(finite), float(np.percentile(finite, 90))
    return 2 * p90 if p90 > 0 and top > 3 * p90 else top


class TimeAxis(Widget):
    """-N s … now under the plots (one point per BUCKET seconds), and the label of each
    knob change under its mark."""

    DEFAULT_CSS = "TimeAxis { height: 1; color: $text-muted; }"
    marks: list = []
    stopped = False         # the right end is the engine's stop, not now

    def show(self, marks, stopped: bool = False) -> None:
        marks = list(marks)
        if marks != self.marks or stopped != self.stopped:
            self.marks, self.stopped = marks, stopped
            self.refresh()

    def render(self) -> Text:
        return axis_text(max(0, self.size.width - Plot.LABEL), self.marks, self.stopped)


def axis_text(n: int, marks: list, stopped: bool = False) -> Text:
    """The axis of `n` columns after its `time →` label: `-N s`, `-N/2 s` and `now` (or
    `stop`), each mark's label over them. A word a label covers in part gives way
    whole: a label ending inside `now` had left `▲preempt swapow`, one over `-22 s`
    `-22▲…`, a time of 22 whose unit was gone."""
    if n < 12:
        return Text("")
    left, mid = f"-{n * BUCKET:.0f} s", f"-{n * BUCKET / 2:.0f} s"
    line = list("─" * n)
    end = "stop" if stopped else "now"
    shown = marks[-n:]
    labels = place_labels([(n - len(shown) + i, label)
                           for i, label in enumerate(shown) if label], n)
    covered = {c for start, word in labels for c in range(start, start + len(word))}
    for pos, word in ((0, left), (n // 2 - len(mid) // 2, mid), (n - len(end), end)):
        if not covered.intersection(range(pos, pos + len(word))):
            line[pos:pos + len(word)] = word
    t = Text(f"{'time →':<{Plot.LABEL}}" + "".join(line)[:n])
    for start, word in labels:
        start += Plot.LABEL
        t = t[:start] + Text(word, "bold #f2d34f") + t[start + len(word):]
    return t


def place_labels(marks: list[tuple[int, str]], n: int) -> list[tuple[int, str]]:
    """(column, text) of each mark's `▲label` on an axis of `n` columns, none over
    another: the newest keeps its whole label (moved left to fit the end: an older mark
    under it then has no label of its own), each older one is cut to the room before the
    next (`▲bud…`, or `▲` alone), one column apart."""
    out, limit = [], n
    for pos, label in reversed(marks):
        if pos >= limit:
            continue                  # under a newer label
        word = "▲" + label
        if not out:                   # the newest: whole, ending at the axis's end at most
            pos = max(0, min(pos, n - len(word)))
            room = n - pos
        else:
            room = limit - pos - 1
        if len(word) > room:
            word = word[:room - 1] + "…" if room >= 3 else "▲"
        out.append((pos, word))
        limit = pos
    return out[::-1]

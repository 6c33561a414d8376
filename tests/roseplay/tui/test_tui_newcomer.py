"""What a newcomer read wrong after the basics: a time axis word half covered by a knob's
label, the waiting reason of a full pool, a cut speculation line (built data, no
engine)."""
from __future__ import annotations

import re

import pytest
from textual.app import App

from roseplay.tui.widgets.plots import Plot, TimeAxis
from tests.roseplay.tui.helpers import sync, widget_text

pytestmark = pytest.mark.timeout(60)
N = 46                                       # the axis's columns at 120x40


async def _axis(marks: list, stopped: bool = False) -> str:
    class AxisApp(App):
        def compose(self):
            yield TimeAxis()
    app = AxisApp()
    async with app.run_test(size=(Plot.LABEL + N, 3)) as pilot:
        axis = app.query_one(TimeAxis)
        axis.show(marks, stopped)
        await pilot.pause()
        return widget_text(axis).splitlines()[0]


@sync
async def test_a_mark_label_never_leaves_part_of_an_axis_word():
    """A label over part of `now` left `▲preempt swapow`, over `-23 s` `-23▲…`: each of
    the axis's words shows whole or not at all."""
    for at in range(22, N):
        marks = [""] * N
        marks[at] = "preempt swap"
        marks[3] = "spec k 3"
        line = (await _axis(marks))[len("time →"):].strip()
        words = [w for w in re.split(r"─+|▲\w+(?: \w+)*", line) if w.strip()]
        assert set(words) <= {"-23 s", "-12 s", "now"}, line
        assert "▲preempt swap" in line, line


@sync
async def test_the_axis_words_show_without_marks():
    line = await _axis([""] * N)
    assert line.startswith("time →") and "-23 s" in line and "-12 s" in line
    assert line.rstrip().endswith("now") and (await _axis([], True)).rstrip().endswith("stop")

"""Speculation's off-switch on screen (docs/SPECULATIVE.md "The off-switch"): while a
step drafted nothing because too many requests decode, This step says so and why, the
Steps strip counts such steps, and the Timing panel's speculation line says it instead
of "no verify"; without the switch they read as before."""
from __future__ import annotations

import dataclasses

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.spec_note import burst_text
from roseplay.tui.widgets.step import StepPanel
from roseplay.tui.widgets.step_strip import number_lines, strip_numbers
from tests.roseplay.tui.helpers import SIZE, StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(120)
PAUSE = "speculation off: 40 decoding > disable_by_batch_size 32"


def speculating(snap, off: int):
    """The snapshot with k = 3, threshold 32, and its last steps `off` decoding (0: on)."""
    steps = tuple(dataclasses.replace(s, spec_off=off) for s in snap.recent_steps)
    return dataclasses.replace(snap, knobs=snap.knobs.replace(num_speculative_tokens=3),
                               spec_method="ngram", spec_disable_by_batch_size=32,
                               recent_steps=steps, last_step=steps[-1])


def test_the_snapshot_says_why_speculation_is_off():
    base = session_snapshot(12)
    assert speculating(base, 40).spec_pause == PAUSE
    assert speculating(base, 0).spec_pause == ""
    off_k = speculating(base, 40)       # k = 0: speculation is off by the knob, not paused
    assert dataclasses.replace(off_k, knobs=off_k.knobs.replace(
        num_speculative_tokens=0)).spec_pause == ""


def test_the_strip_and_the_timing_line_name_the_off_switch():
    snap = speculating(session_snapshot(12), 40)
    n = strip_numbers(snap, snap.recent_steps)
    assert n.spec_off == len(snap.recent_steps)
    line = number_lines(n, snap, wide=True)[-1].plain
    assert f"off in {n.spec_off} steps (> disable_by_batch_size 32 decoding)" in line
    assert PAUSE in burst_text(snap, 0.0).plain
    on = speculating(session_snapshot(12), 0)
    assert "off in" not in number_lines(strip_numbers(on, on.recent_steps), on, True)[-1].plain
    assert "speculation off" not in burst_text(on, 0.0).plain


@sync
async def test_this_step_shows_the_pause_line():
    base = session_snapshot(12)
    source = StaticSource(speculating(base, 40))
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_panels()
        await pilot.pause()
        text = widget_text(app.query_one(StepPanel))
        assert "spec ngram k=3 off: 40 decoding > disable_by_batch_size 32" in text  # whole
        source.snap = speculating(base, 0)
        app.refresh_panels()
        await pilot.pause()
        assert "speculation off" not in widget_text(app.query_one(StepPanel))


def test_the_timing_panel_takes_speculation_before_its_plots_are_mounted():
    """The app's timer can show a snapshot before the Timing panel's children are
    mounted: the speculation plots then turn on and wait for the panel's first resize to
    be sized (sizing them there raised NoMatches, and the exception ended the app)."""
    from roseplay.tui.widgets.timing import SPEC_PLOTS, TimingPanel
    panel = TimingPanel(id="timing")
    panel._show_spec_plots(speculating(session_snapshot(12), 0))
    assert all(panel.plots[key].display for key in SPEC_PLOTS)

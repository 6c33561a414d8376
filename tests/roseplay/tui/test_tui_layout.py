"""The app at common terminal sizes, the help screen, and numbers that do not mislead
(issue 18), on a paused replay of the committed session."""
from __future__ import annotations

import re
from contextlib import asynccontextmanager

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.layout import plan
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets.kv_panel import KVLegend
from roseplay.tui.widgets.knobs import KnobsPanel
from roseplay.tui.widgets.step import StepPanel
from roseplay.tui.widgets.timing import Plot, TimingStats
from roseplay.tui.widgets.kv_panel import pool_title
from tests.roseplay.tui.helpers import (SESSION, StaticSource, screen_text, session_snapshot,
                                        sync, wait_for, widget_text)

pytestmark = pytest.mark.timeout(120)


async def _at(pilot, app, frame: int = 12) -> str:
    """The screen at `frame`, once the footer has drawn its keys: on a slow host the
    Footer recomposes its bindings a few frames after the panels (CI saw a blank row)."""
    app.source.seek(frame)
    app.refresh_panels()
    await pilot.pause()
    text = screen_text(app)
    for _ in range(40):
        if text.splitlines()[-1].strip():
            break
        await pilot.pause(0.05)
        text = screen_text(app)
    return text


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
@sync
async def test_footer_has_help_and_quit_and_no_panel_is_cut(size):
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=size) as pilot:
        rows = (await _at(pilot, app)).splitlines()
        assert len(rows) == size[1]
        assert "? Help" in rows[-1] and "q Quit" in rows[-1]
        legend = widget_text(app.query_one(KVLegend))
        assert ("COW" in legend or " C " in legend) and ("preempted" in legend or "pre " in legend)
        assert all(not line.rstrip("│ ").endswith("…") for line in legend.splitlines()[2:])
        knobs = widget_text(app.query_one(KnobsPanel))
        # a value never runs into its name
        assert re.search(r"64 tok(/step)? +(max_num_batched_tokens|budget)\b", knobs)
        rows = [row for row in knobs.splitlines() if "(? help)" not in row]  # (a cut help
        assert "…" not in "".join(rows), knobs     # line says so) no name cut (issue 22:
        #                                            "prefix ca…" at 80x24)
        for plot in app.query(Plot):
            if plot.display and app.layout_plan.timing != "stats":
                assert plot.points() >= 40, (size, plot.points())     # 20 s of history at least


@sync
async def test_small_terminal_says_what_it_hid():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(80, 24)) as pilot:
        text = await _at(pilot, app)
        assert "hidden at 80×24: This step, Steps, Events, timing plots · z zooms a panel" \
            in text
        assert "Selected request" in text      # the answer to a prompt stays readable
        # the list's missing columns, named or counted, in a form that fits whole
        assert re.search(r"(no room for [a-z, ]+|\d+ columns hidden): z zooms", text), text
        assert "z zo…" not in text


def test_the_plan_keeps_every_panel_at_120x40_and_200x60():
    for size in ((120, 40), (200, 60)):
        p = plan(*size)
        assert set(p.heights) == {"kv", "step", "strip", "knobs", "requests", "detail",
                                  "events", "timing"} and p.note == ""
        assert p.timing in ("side", "stacked")
    assert plan(200, 60).timing == "side"


@sync
async def test_help_scrolls_from_the_keyboard_and_lists_keys_of_the_mode():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        scroll = app.screen.query_one("#help-scroll")
        assert app.focused is scroll
        await pilot.press("down", "down", "j", "pagedown")
        assert scroll.scroll_y > 10
        text = app.screen.query_one("#help-body").source
        # a handful of widgets: one per Markdown block (~600) took ~1.5 CPU-s to open
        assert len(app.screen.query("*")) < 20
        assert "left_square_bracket" not in text and "seek back 5 s" in text
        assert "prefix cache on / off" not in text        # live keys are not a replay's
        assert "↑ ↓  k j" in text and "Esc" in text
        await pilot.press("escape")
        assert type(app.screen).__name__ != "HelpScreen"


@sync
async def test_live_help_has_no_replay_keys():
    from roseplay.tui.widgets.help import keys_markdown
    live = keys_markdown("live")
    assert "seek back" not in live and "previous frame" not in live
    assert "| `[` | max_num_seqs down |" in live and "| `+` |" in live


@sync
async def test_numbers_do_not_mislead():
    snap = session_snapshot(12)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        text = screen_text(app)
        assert "gaps" not in text                           # no buffer cap read as a count
        assert text.count("TTFT p50") <= 1
        top = re.search(r"step (\d+)", widget_text(app.query("StatusBar").first())).group(1)
        this = re.search(r"step (\d+)", widget_text(app.query_one(StepPanel))).group(1)
        assert top == this == str(snap.step)                # the same step, counted from 1
        assert "p50" in widget_text(app.query_one(TimingStats))


@sync
async def test_empty_plots_say_no_data_not_max_zero():
    snap = session_snapshot(0)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        plots = "\n".join(widget_text(p) for p in app.query(Plot))
        assert "0.0ms" not in plots and "TTFT -" in plots     # a dash, not a value of 0


def test_an_outlier_does_not_flatten_the_plot():
    from roseplay.tui.widgets.timing import scale_top
    values = [0.010] * 50 + [50.3]             # one 50 s TPOT among 10 ms ones
    assert scale_top(values) == pytest.approx(0.020)
    assert scale_top([0.010, 0.012, 0.011]) == 0.012


@sync
async def test_resizing_the_terminal_lays_out_again():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await _at(pilot, app)
        assert app.layout_plan.note == "" and app.query_one("#events").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        assert app.layout_plan.note.startswith("hidden at 80×24")
        assert not app.query_one("#events").display
        await pilot.resize_terminal(200, 60)
        await pilot.pause(0.3)
        assert app.layout_plan.timing == "side" and app.query_one("#events").display


def test_width_dependent_titles_follow_a_resize_of_a_paused_session(monkeypatch):
    """The KV panel's title picks its form by the panel's width: after a resize of a
    paused replay (the same snapshot, no key) the panel writes it again at its new width
    itself (borders.WidthBorders). The app's periodic redraw and its redraw after a new
    layout are both off here: on a loaded box Textual may size the panel after them (the
    title once stayed in its short form on a 200-column screen that way)."""
    monkeypatch.setattr(RoseplayApp, "_tick", lambda self: None)
    _resize_and_read_titles()


@asynccontextmanager
async def _paused_without_redraws(size):
    """A paused replay drawn once, then the app's redraw after a layout turned off (the
    tests turn its periodic one off too): what a resize changes is the panels' own doing."""
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=size) as pilot:
        await _at(pilot, app)
        app.refresh_panels = lambda: None
        yield app, pilot


@sync
async def _resize_and_read_titles():
    async with _paused_without_redraws((80, 24)) as (app, pilot):
        short = app.kv.border_title
        await pilot.resize_terminal(200, 60)
        assert await wait_for(pilot, lambda: app.kv.border_title != short, 10), short
        assert app.kv.border_title.startswith("KV cache · ")
        assert app.kv.border_title == pool_title(app.snapshot, app.kv.size.width)
        await pilot.resize_terminal(80, 24)
        assert await wait_for(pilot, lambda: app.kv.border_title == short, 10)
        # the request list's subtitle names the columns its width leaves out, at each width
        narrow = app.requests.border_subtitle
        assert narrow.endswith("z zooms"), narrow
        await pilot.resize_terminal(200, 60)
        assert await wait_for(pilot, lambda: "z zooms" not in app.requests.border_subtitle, 10)


def test_panels_drawn_for_their_size_draw_again_when_it_changes(monkeypatch):
    """The step strip, the step panel and the event log build their text in show() for
    their size; after a resize of a paused replay they build it again themselves
    (reshow.ReshownOnResize), with the app's redraws off as in the test above."""
    monkeypatch.setattr(RoseplayApp, "_tick", lambda self: None)
    _resize_and_read_strip()


@sync
async def _resize_and_read_strip():
    async with _paused_without_redraws((120, 40)) as (app, pilot):
        bars = _bar_columns(app)
        await pilot.resize_terminal(200, 60)
        assert await wait_for(pilot, lambda: _bar_columns(app) > bars, 10), bars
        assert await wait_for(pilot, lambda: _widest(app.events) > 100, 10)


def _bar_columns(app) -> int:
    """Columns of the step strip's first bar row as drawn."""
    return len(app.strip.render().plain.split("\n")[0].rstrip())


def _widest(widget) -> int:
    return max(len(line) for line in widget.render().plain.split("\n"))


@sync
async def test_the_kv_legend_takes_the_form_of_its_new_width_without_a_new_snapshot():
    """The legend's words shrink with its width (initials below 44 columns): a legend last
    drawn narrow (as at start, before Textual sized the panel) is written again when its
    width grows, with no new snapshot and no redraw of the app (seen once under a loaded
    suite: the initials stayed on a 160-column screen of an idle engine)."""
    from textual.app import App
    from roseplay.tui.widgets.counters import CounterWindow

    class LegendOnly(App):
        def compose(self):
            yield KVLegend()

    snap, window = session_snapshot(), CounterWindow()
    window.feed(snap)
    app = LegendOnly()
    async with app.run_test(size=(30, 6)) as pilot:
        legend = app.query_one(KVLegend)
        legend.show_legend(snap, None, "roomy", "", window, False)
        narrow = widget_text(legend)
        assert "free" not in narrow and narrow.startswith("f ")
        await pilot.resize_terminal(120, 6)
        assert await wait_for(pilot, lambda: "free" in widget_text(legend), 10)
        await pilot.resize_terminal(30, 6)
        assert await wait_for(pilot, lambda: widget_text(legend) == narrow, 10)


@pytest.mark.parametrize("width", [80, 120, 200])
@sync
async def test_the_status_line_fits_while_paused_and_recording(width):
    """Paused and recording, the top line ran past 120 columns (`… decode C layer
    (cpu_native)…`): the fullest form that fits is drawn, the KV size, the decode path's
    long name, the pause hint's words and the device going first; never the step."""
    from dataclasses import replace

    from textual.app import App

    from roseplay.tui.widgets.status import StatusBar
    snap = replace(session_snapshot(12), backend="cpu_native", model="default",
                   kv_bytes_per_rank=2 ** 26, step=40340)

    class Top(App):
        def compose(self):
            yield StatusBar()

    app = Top()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.show(snap, "live", True, "● REC 123.4 MB  ")
        await pilot.pause()
        line = widget_text(bar).rstrip()
    assert "…" not in line and len(line) <= width, line
    assert "PAUSED" in line and "● REC 123.4 MB" in line and "step 40340" in line, line
    assert ("n: one step · space: resume" in line and "KV 0.06 GiB" in line) == (width == 200)
    if width == 120:
        assert "n: step · space: resume" in line and "decode C layer" in line, line

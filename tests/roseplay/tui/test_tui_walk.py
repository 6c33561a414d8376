"""What a newcomer's walk through the app at 80x24, 120x40 and 200x60 read cut: the
Knobs panel's first hint (`? explain… (? help)` at 120x40, `press a key to turn… (? help)`
at 80x24) and the event log's eviction line (`… reused for new tokens…` at 120x40)."""
from __future__ import annotations

import dataclasses

import pytest

from engine.codes import EV_EVICT
from engine.snapshot import EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.knobs import KnobsPanel
from tests.roseplay.tui.helpers import (StaticSource, live_source, session_snapshot, sync,
                                        wait_for, widget_text)

pytestmark = pytest.mark.timeout(120)
SIZES = [(80, 24), (120, 40), (200, 60)]


async def after_keys(size, keys, read):
    """`read(app)` on a paused live session of `size` once `keys` are pressed."""
    src = live_source(concurrency=1, paused=True)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=size) as pilot:
            if keys:
                await pilot.press(*keys)
            else:
                app.refresh_panels()
            await pilot.pause()
            return app, read(app)
    finally:
        src.close()


@pytest.mark.parametrize("size", SIZES)
@sync
async def test_the_knobs_first_hint_is_whole(size):
    _, knobs = await after_keys(size, (), lambda app: widget_text(app.query_one(KnobsPanel)))
    assert "…" not in knobs, knobs
    if size != (80, 24):                  # (80x24's panel has no row for it)
        assert "press a key to turn a knob; ? explains every panel" in knobs, knobs


@pytest.mark.parametrize("size", SIZES[1:])         # (80x24 hides the event log)
@sync
async def test_the_eviction_line_is_whole_words(size):
    snap = session_snapshot(12)
    snap = dataclasses.replace(snap, events=tuple(
        EngineEvent(snap.step, snap.time - 0.1 * i, EV_EVICT, None, (4 * i, 4 * i + 1))
        for i in range(10)))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        app.refresh_panels()
        await pilot.pause()
        log = app.query_one(EventLog)
        line = next(row for row in widget_text(log).splitlines() if "evict" in row)
    assert "20 cached blocks/s reused" in line and "…" not in line, line


@pytest.mark.parametrize("size", SIZES)
@sync
async def test_a_knobs_explanation_on_the_message_line_ends_at_a_whole_word(size):
    """`c` at 120x40 read `… Turning i…`: the line ends at a sentence or a word."""
    app, shown = await after_keys(size, ("c",), lambda app: widget_text(app.note).strip())
    full = app.messages[-1][1]
    assert shown.startswith("· enable_prefix_caching: "), shown
    words = shown[2:].rstrip(" …").split()
    assert words == full.split()[:len(words)] and len(shown) <= size[0], (shown, full)
    assert shown.endswith("…") == (len(full) + 4 > size[0])


@pytest.mark.parametrize("size,key", [(SIZES[0], "m"), (SIZES[1], "m"), (SIZES[0], "minus"),
                                      (SIZES[0], "c"), (SIZES[0], "s")])
@sync
async def test_a_cut_knob_help_ends_at_a_whole_word(size, key):
    """The Knobs panel's help line after `m` read `scheduling_mode: Wh… (? help)` at
    80x24 and `… holds: b… (? help)` at 120x40; after `-` or `c` at 80x24 the knob's name
    alone was cut (`max_num_batched_toke… (? help)`): a narrow panel's help names the
    knob as its row does (`budget: …`)."""
    from roseplay.tui.widgets.knobs import NARROW_NAMES
    from roseplay.workload.scenarios import SCENARIOS

    def read(app):
        rows = widget_text(app.query_one(KnobsPanel)).splitlines()
        return rows[-2], rows[1:-2], app.source.workload()
    app, (help_row, knob_rows, workload) = await after_keys(size, (key,), read)
    shown = help_row.strip("│ ")
    assert shown.endswith("… (? help)"), shown
    name = app.knobs.last_changed
    full = app.knobs.help_line(False, workload)
    if name == "scenario":      # 80x24 read "scenario… (? help)": its name and words
        scenario = SCENARIOS[workload["scenario"]]
        full = f"{scenario.name}: {scenario.description}"
    elif not any(f" {name} " in row for row in knob_rows):      # rows with short names
        assert full.startswith(f"{name}: ")
        full = f"{NARROW_NAMES[name]}{full[len(name):]}"
    full = full.split()
    words = shown[:-len("… (? help)")].split()
    assert words and words[:-1] == full[:len(words) - 1], (shown, full)
    assert full[len(words) - 1].startswith(words[-1]) and \
        full[len(words) - 1].rstrip(":,;") == words[-1], (shown, full)


@pytest.mark.parametrize("size", SIZES)
@sync
async def test_the_prompt_fields_placeholder_is_whole(size):
    """80x24 cut the prompt field's placeholder to `prompt · Enter sends · Tab:`."""
    from textual.widgets import Input
    def read(app):
        field = app.query_one("#prompt-input", Input)
        return field.placeholder, widget_text(field).strip(), field.size.width
    _, (placeholder, shown, width) = await after_keys(size, ("i",), read)
    assert shown == placeholder and shown.startswith("prompt · Enter sends"), shown
    assert len(shown) < width


@sync
async def test_a_guide_that_sorts_the_list_shows_its_top():
    """Guide 1 sorts by state to show `chunk k/n` at the top, but a typed prompt, selected
    and finished, kept the list scrolled down to its row: the guide follows the top."""
    src = live_source(concurrency=24, paused=True)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            lst = app.requests

            def ended():
                src.step_once()
                app.refresh_panels()
                return sum(r.state == "finished" for r in lst.rows) > lst.size.height
            assert await wait_for(pilot, ended, 60)
            ended = [r.request_id for r in lst.rows if r.state == "finished"]
            lst.select(ended[-1])              # the last row: the list scrolls down to it
            await pilot.pause()
            assert lst.top > 0
            await pilot.press("question_mark", "1")
            await pilot.pause()
            app.refresh_panels()
            await pilot.pause()
            assert lst.sort == "state" and lst.selected is None and lst.top == 0
    finally:
        src.close()


@pytest.mark.parametrize("size", SIZES[1:])
@sync
async def test_this_steps_prefill_line_names_whole_chunks(size):
    """Two chunks in a step read `prefill w0-3673 chunk 3/3 7 tok [259:266/266] …` at
    120x40: the second cut. Whole chunks, then how many more."""
    from engine.snapshot import ChunkInfo
    from roseplay.tui.widgets.step import StepPanel
    snap = session_snapshot(12)
    rid = snap.requests[0].request_id
    chunks = tuple(ChunkInfo(f"{rid}{'x' * i}", 259, 7, 266) for i in range(3))
    snap = dataclasses.replace(snap, last_step=dataclasses.replace(
        snap.last_step, prefill_chunks=chunks, prefill_tokens=21))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        app.refresh_panels()
        await pilot.pause()
        line = next(row for row in widget_text(app.query_one(StepPanel)).splitlines()
                    if "prefill " in row and " tok in " not in row).strip("│ ")
    assert "…" not in line and f"{rid} chunk 1/1 7 tok" in line, line
    assert line.endswith(("more", "/266]", "7 tok")), line


@sync
async def test_a_priority_queue_shows_the_pri_column_at_80x24():
    """Guide 9 (scheduling_policy priority) says to watch the list's pri column, which
    80x24 hid ("4 columns hidden"): under priority TPOT gives way to it."""
    snap = session_snapshot(12)
    for policy, shown in (("fcfs", False), ("priority", True)):
        app = RoseplayApp(source=StaticSource(dataclasses.replace(
            snap, knobs=snap.knobs.replace(scheduling_policy=policy))))
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_panels()
            await pilot.pause()
            header = widget_text(app.requests).splitlines()[1].split()
        assert ("pri" in header) == shown and ("TPOT" in header) != shown, (policy, header)


@pytest.mark.parametrize("size", SIZES[2:])          # (smaller: no row for it)
@sync
async def test_the_steps_legend_is_whole(size):
    """At 200x60 the Steps panel's legend read `… full height = the most`, cut unsaid:
    the longest form that fits shows whole."""
    from roseplay.tui.widgets.step_strip import StepStrip
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=size) as pilot:
        app.refresh_panels()
        await pilot.pause()
        strip = app.query_one(StepStrip)
        rows = widget_text(strip).splitlines()
    legend = [row.strip("│ ") for row in rows if "█ decode" in row]
    assert legend and legend[0].endswith("changed"), rows


@pytest.mark.parametrize("size", SIZES[:2])
@sync
async def test_the_help_says_how_to_leave_on_its_first_page(size):
    """`?` at 80x24 opened a page with no footer and no word on scrolling or closing
    (`esc, q or ? closes this screen` was its last line, screens below)."""
    from tests.roseplay.tui.helpers import screen_text
    from roseplay.tui.widgets.help import CLOSE_HINT
    app, text = await after_keys(size, ("question_mark",), screen_text)
    assert CLOSE_HINT in text, text


@pytest.mark.parametrize("width", [46, 50, 52, 60])
def test_the_kv_legends_two_lines_read_one_wording(width):
    """At 120x40 the last 10 s read `ev 203/s pre 0 C 0` above the totals' `evicted 5911 ·
    preempted 0 · COW 0`: one line fit the long wording, the other not. Both take the
    longest wording that fits both."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.kv_panel import legend_text
    counts = {"evictions": 5911, "preemptions": 0, "cow_copies": 0}
    recent = {"evictions": 2030, "preemptions": 0, "cow_copies": 0}
    window = SimpleNamespace(window=10.0, span=lambda: 10.0, base=None,
                             peak_used=lambda snap: 244, hit_rate=lambda recent: 0.65,
                             recent=recent.get, total=counts.get)
    lines = legend_text(session_snapshot(12), None, "full", "", window, width).plain.splitlines()
    recent_line, total_line = lines[-2], lines[-1]
    assert all(len(line) <= width for line in lines[-2:]), lines
    assert ("evicted" in recent_line) == ("evicted" in total_line), lines


@sync
async def test_a_long_replays_top_line_keeps_its_counts_at_80x24():
    """A 47 s recording's top line read `… frame 205/413  step 2096  finished…` at 80x24:
    the frame count, then the words playing/paused give way; step and finished stay."""
    from textual.app import App

    from roseplay.tui.widgets.status import StatusBar
    snap = session_snapshot(12)
    snap = dataclasses.replace(snap, step=2096, counters=dataclasses.replace(
        snap.counters, finished=488))

    class Bar(App):
        def compose(self):
            yield StatusBar()
    app = Bar()
    async with app.run_test(size=(80, 3)) as pilot:
        bar = app.query_one(StatusBar)
        for paused in (False, True):
            bar.show(snap, "replay", paused, "  23.4/47.6 s  frame 205/413")
            await pilot.pause()
            line = widget_text(bar).rstrip()
            assert "step 2096  finished 488" in line and "…" not in line, line
            assert "23.4/47.6 s" in line, line

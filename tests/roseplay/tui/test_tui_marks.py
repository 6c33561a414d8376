"""Each request's priority in the request list (from the engine's snapshot, across the
engine process), and a replay that marks its plots where the recorded session changed
a knob or picked a guide, as the live app did."""
from __future__ import annotations

import dataclasses
import re

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.marks import RecordedMarks
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets.requests import RequestList
from roseplay.tui.widgets.timing import BUCKET, TimeAxis, TimingHistory
from tests.roseplay.tui.helpers import (SESSION, fast_idle, live_source, session_snapshot, sync, wait_for,
                                       widget_text)

pytestmark = pytest.mark.timeout(120)


def _labels(app) -> list[str]:
    return [m for m in app.timing.history.marks if m]


def _changes(app) -> list[str]:
    """The marked changes in order (the last point may carry several, joined)."""
    return [part for m in _labels(app) for part in m.split(" · ")]


def test_two_changes_within_one_bucket_are_two_marks_in_order():
    """A replay tick (or a fast pair of keys) can bring two changes before the next
    point: both are marked, on consecutive points, the first first."""
    history, snap = TimingHistory(), session_snapshot(12)
    history.feed(snap)
    history.mark("budget 256")
    history.mark("guide 4")
    for i in (1, 2, 3):
        history.feed(dataclasses.replace(snap, time=snap.time + i * BUCKET))
    assert list(history.marks) == ["budget 256", "guide 4", None]


def test_the_last_frame_puts_waiting_changes_on_a_point():
    """No frame comes after a replay's last: a change in its part bucket (or several)
    still gets a point, not a mark that waits forever."""
    history, snap = TimingHistory(), session_snapshot(12)
    history.feed(snap)
    history.feed(dataclasses.replace(snap, time=snap.time + BUCKET))
    history.mark("budget 256")
    history.mark("guide 4")
    near = dataclasses.replace(snap, time=snap.time + 1.2 * BUCKET)
    history.feed(near)
    assert list(history.marks) == [None]                 # not yet a bucket: it waits
    history.feed(near, final=True)
    assert list(history.marks) == [None, "budget 256 · guide 4"]
    assert not history._pending


def _recorded_labels(recording) -> list[str]:
    marks = RecordedMarks()
    return [label for e in recording.entries for label in map(marks.label, e.events) if label]


@sync
async def test_a_replay_that_jumps_to_its_end_in_one_tick_keeps_every_mark():
    """Played so fast that one refresh crosses every recorded change and the end: the
    changes are taken before the frame is fed, and the last frame puts them on a point."""
    replay = RoseplayApp(source=ReplaySource(SESSION, speed=1e4, start_paused=True))
    async with replay.run_test(size=(120, 40)) as pilot:
        src = replay.source
        expected = _recorded_labels(src.recording)
        assert len(expected) >= 2, expected
        await pilot.press("space")
        assert await wait_for(pilot, lambda: src.at_end, 30)
        replay.refresh_panels()
        assert _changes(replay) == expected
        await pilot.press("g", "G")                      # a seek rebuilds: the same changes
        assert _changes(replay) == expected


@sync
async def test_the_request_list_shows_each_requests_priority(monkeypatch):
    fast_idle(monkeypatch)
    # the engine in its own process: the priority crosses it in the snapshot
    src = live_source(scenario="mixed", concurrency=8, in_process=False)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            lst = app.query_one(RequestList)
            rid = src.submit("a typed prompt that jumps the queue", priority=-2)
            assert await wait_for(pilot, lambda: {0, 1, -2} <= {
                r.priority for r in src.snapshot().requests}, 20)
            await pilot.press("f")                       # only the active ones: rows on screen
            assert await wait_for(pilot, lambda: {0, 1} <= {r.priority for r in lst.rows}, 30)
            text = widget_text(lst)
            header = text.splitlines()[1]
            assert re.search(r"state +pri ", header), header
            rows = {r.request_id: r.priority for r in lst.rows}
            assert rows.get(rid, -2) == -2
            shown = {m.group(1): int(m.group(2)) for m in re.finditer(
                r"│\s+(\S+)\s+\w+\s+(-?\d+) ", text)}
            assert shown and all(rows[r] == p for r, p in shown.items() if r in rows), text
            await pilot.press("O")                       # sort: back from arrival to priority
            assert await wait_for(pilot, lambda: lst.sort == "priority" and len(lst.rows) > 2, 30)
            assert [r.priority for r in lst.rows] == sorted(r.priority for r in lst.rows)
    finally:
        src.close()


@sync
async def test_a_replay_marks_the_recorded_knob_changes_like_the_live_app(monkeypatch, tmp_path):
    fast_idle(monkeypatch)
    path = str(tmp_path / "s.jsonl.gz")
    src = live_source(record=path, rate=5.0)    # (the marks need time, not a busy engine)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(160, 48)) as pilot:
        t0 = src.snapshot().time
        assert await wait_for(pilot, lambda: src.snapshot().time > t0 + 1.0, 60)
        await pilot.press("minus")                       # budget 512 -> 256
        t1 = src.snapshot().time
        assert await wait_for(pilot, lambda: src.snapshot().time > t1 + 1.0, 60)
        await pilot.press("question_mark")
        assert await wait_for(pilot, lambda: type(app.screen).__name__ == "HelpScreen", 30)
        await pilot.press("4")                           # a guide: many knobs, one mark
        t2 = src.snapshot().time
        assert await wait_for(pilot, lambda: src.snapshot().time > t2 + 2.0, 60)
        live = _labels(app)
        await pilot.press("q")
    assert live == ["budget 256", "guide 4"]

    # x8: a tick may cross a change and the end (the last frame still marks it)
    replay = RoseplayApp(source=ReplaySource(path, speed=8.0, start_paused=True))
    async with replay.run_test(size=(160, 48)) as pilot:
        src = replay.source
        await pilot.press("space")                       # play from the first frame
        played = src.recording.entries[-1].t / 8.0 + 30      # x8, and a loaded box's lag
        assert await wait_for(pilot, lambda: src.index + 1 == len(src.recording), played)
        await pilot.pause(0.3)
        replay.refresh_panels()
        assert _changes(replay) == live                 # played: the same marks
        await pilot.press("g", "G")                      # a seek rebuilds the plots
        assert _changes(replay) == live
        axis = widget_text(replay.query_one(TimeAxis))
        # the newest label whole (after the budget's on the last point if both fell in its
        # bucket); the budget's ▲ too unless that label, moved left to fit the axis's end,
        # lies over it (a loaded box leaves the two marks close)
        assert re.search(r"▲(budget 256 · )?guide 4", axis) and axis.count("▲") in (1, 2), axis

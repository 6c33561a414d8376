"""Issue 22's on-screen defects, each on a built or recorded snapshot (no engine): what a
verify event says, request ids from `roseplay serve`, the time axis's labels, ..."""
from __future__ import annotations

import dataclasses
import re

import pytest

from engine.codes import EV_SPEC_VERIFY
from engine.snapshot import EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.requests import RequestList
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(120)


async def _shown(app, pilot) -> None:
    app.refresh_panels()
    await pilot.pause()


@sync
async def test_only_a_verify_that_rolled_blocks_back_carries_r():
    """Every verify event carried `R` (rolled back), even 3 drafted / 3 accepted."""
    snap = session_snapshot(12)
    t, step = snap.time, snap.step
    events = (EngineEvent(step, t, EV_SPEC_VERIFY, "w0-1", (), "3 drafted, 3 accepted"),
              EngineEvent(step, t, EV_SPEC_VERIFY, "w0-2", (40,),
                          "3 drafted, 0 accepted, 1 block(s) rolled back"))
    app = RoseplayApp(source=StaticSource(dataclasses.replace(snap, events=events)))
    async with app.run_test(size=(120, 40)) as pilot:
        await _shown(app, pilot)
        lines = widget_text(app.query_one(EventLog)).splitlines()
        kept = next(line for line in lines if "3 accepted" in line)
        rolled = next(line for line in lines if "0 accepted" in line)
        assert " R spec verify" in rolled and " R spec verify" not in kept, lines


@sync
async def test_served_request_ids_keep_the_end_that_tells_them_apart():
    """Under --connect every served request read "cmpl-7…": the ids differ at the end."""
    snap = session_snapshot(12)
    ids = [f"cmpl-7a3f9c2d{i:08x}" for i in range(len(snap.requests))]
    views = tuple(dataclasses.replace(r, request_id=i) for r, i in zip(snap.requests, ids))
    app = RoseplayApp(source=StaticSource(dataclasses.replace(snap, requests=views)))
    async with app.run_test(size=(120, 40)) as pilot:
        await _shown(app, pilot)
        rows = widget_text(app.query_one(RequestList)).splitlines()[2:6]
        shown = [re.search(r"│\s+(\S+)", row).group(1) for row in rows]
        assert len(set(shown)) == len(shown), shown
        assert all(s.startswith("…") and s[1:] in ids[int(s[1:], 16) % 2 ** 32]
                   for s in shown), shown


@sync
async def test_time_axis_labels_never_run_into_each_other():
    """Knob changes in neighbouring points wrote "▲pref▲▲budget 32", "▲spec k 0w"."""
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(120, 40)) as pilot:
        await _shown(app, pilot)
        axis = app.timing.axis
        for marks in ([None] * 20 + ["step prefill-first", None, "budget 32"],
                      [None] * 20 + ["spec k 0", "guide d", None, None],
                      ["budget 32", "budget 64"] + [None] * 3 + ["queue priority"]):
            axis.show(marks)
            await pilot.pause()
            line = widget_text(axis).strip("│ ")
            labels = [m for m in marks if m]
            assert "▲" + labels[-1] in line, line           # the newest whole
            for seg in re.findall(r"▲[^▲]*", line):         # each older one whole, cut
                text = seg.rstrip(" ─")                      # with "…", or a ▲ alone,
                assert any(text == "▲" + m or (text.endswith("…") and m.startswith(
                    text[1:-1])) for m in labels) or seg == "▲" or seg[1] in " ─" or \
                    text.startswith("▲" + labels[-1]), (seg, line)   # and one apart

"""The request list's id column keeps ids apart at 80x24: past 9999 a workload id read
`…-10000` (its process's tag cut off), the same as another app's `w0abc-10000` on the
engine, and as a typed prompt's `you-<tag>-10000` would."""
from __future__ import annotations

import dataclasses
import re

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.request_ids import short_id
from roseplay.workload.driver import PROCESS_TAG
from roseplay.workload.own_prompts import own_request_id
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(60)
IDS = (f"w0{PROCESS_TAG}-10000", f"w0{PROCESS_TAG}-10001", "w0abc-10000",
       own_request_id(10000))     # (80x24's list shows 4 rows)


def reads_as(cell: str, request_id: str) -> bool:
    """`cell` is `request_id` with "…" standing for some of its characters (a dash
    between a tag's letters and a counter's digits may go too)."""
    parts = [re.escape(p) for p in cell.split("…")]
    return re.fullmatch(".*".join(parts), request_id) is not None or \
        re.fullmatch(".*".join(parts), request_id.replace("-", "")) is not None


async def id_cells(size) -> dict[str, str]:
    snap = session_snapshot(12)
    rows = tuple(dataclasses.replace(r, request_id=rid, grammar=None)
                 for rid, r in zip(IDS, snap.requests))
    assert len(rows) == len(IDS)
    app = RoseplayApp(source=StaticSource(dataclasses.replace(snap, requests=rows)))
    async with app.run_test(size=size) as pilot:
        app.refresh_panels()
        await pilot.pause()
        lines = widget_text(app.requests).splitlines()[2:2 + len(IDS)]
        width = app.requests._widths(app.requests.columns())[0]
    shown = [line.strip("│")[1:1 + width].rstrip() for line in lines]
    by_row = {r.request_id: s for r, s in zip(app.requests.rows, shown)}
    return by_row


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@sync
async def test_ids_past_9999_read_apart(size):
    cells = await id_cells(size)
    assert len(set(cells.values())) == len(IDS), cells
    for rid, cell in cells.items():
        assert reads_as(cell, rid), (rid, cell)
    mine = cells[f"w0{PROCESS_TAG}-10000"]
    assert mine.startswith(("w0", f"…{PROCESS_TAG}")) and mine.endswith("10000"), mine


def test_short_forms_keep_the_tag_where_it_fits():
    rid = f"w0{PROCESS_TAG}-10000"
    assert short_id(rid, 10) == f"…{PROCESS_TAG}-10000"
    assert short_id(rid, 9) == f"…{PROCESS_TAG}10000"
    assert short_id(rid, 8) == "w0…10000"        # this process's tag: on all its rows
    assert short_id(f"w0{PROCESS_TAG}-1234", 8) == f"…{PROCESS_TAG}1234"
    assert short_id(own_request_id(10000), 9) == "you…10000"
    assert short_id("cmpl-ab12cd34ef", 8) == "…2cd34ef"     # serve's: the end


@pytest.mark.parametrize("size,whole", [((200, 60), True), ((120, 40), False)])
@sync
async def test_a_wide_event_log_shows_whole_ids(size, whole):
    """At 200x60 (and zoomed) the event log cut ids to 8 cells, `…wuf3165`, beside 60
    empty ones: a wide log has 12."""
    from engine.codes import EV_PREEMPT
    from engine.snapshot import EngineEvent
    from roseplay.tui.widgets.events import EventLog
    snap = session_snapshot(12)
    rid = f"w0{PROCESS_TAG}-10000"
    snap = dataclasses.replace(snap, events=(EngineEvent(snap.step - 1, snap.time, EV_PREEMPT,
                                                         rid, (3, 4)),))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        app.refresh_panels()
        await pilot.pause()
        line = next(row for row in widget_text(app.query_one(EventLog)).splitlines()
                    if "preempt" in row)
    assert (f" {rid} " in line) == whole and "freed 2" in line, line
    if not whole:
        assert f" {short_id(rid, 8)} " in line, line

"""A request preempted in prefill keeps its notes whole at 80x24 (built data, no engine):
the Selected panel's TTFT split had the note wrap onto a row the 42-column panel lacks,
and the request list's 8-cell progress column cut `preempted ×1: recompute` to
`preempt…` (13 cells at 120x40: `preempted ×1…`)."""
from __future__ import annotations

import dataclasses

import pytest

from roseplay.tui.app import RoseplayApp
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(60)


def _snapshot():
    """A finished prompt preempted once in prefill (queue 1397 ms, 4 chunks 152 ms) and
    one preempted now."""
    snap = session_snapshot(12)
    t, base = snap.time, snap.requests[0]
    done = dataclasses.replace(base, request_id="done", state="finished", arrival_time=t - 3,
                               ttft=1.5496, scheduled_ts=t - 3 + 1.3974,
                               last_chunk_ts=t - 3 + 1.5174, prefill_chunks=4,
                               prefill_preemptions=1, preemptions=1)
    now = dataclasses.replace(base, request_id="now", state="preempted", arrival_time=t - 3,
                              ttft=None, scheduled_ts=t - 2, last_chunk_ts=None,
                              prefill_chunks=3, chunks_done=2, prefill_preemptions=1,
                              preemptions=1, output_tokens=0)
    swapped = dataclasses.replace(now, request_id="swp", swapped=True)
    return dataclasses.replace(snap, requests=(done, now, swapped) + snap.requests)


async def _shown(size, rid: str) -> tuple[str, str]:
    app = RoseplayApp(source=StaticSource(_snapshot()))
    async with app.run_test(size=size) as pilot:
        app.requests.select(rid)
        for _ in range(2):
            app.refresh_panels()
            await pilot.pause()
        row = next(line for line in widget_text(app.requests).splitlines() if f" {rid} " in line)
        return widget_text(app.detail), row


@sync
async def test_a_prompt_preempted_in_prefill_keeps_its_split_note_at_80x24():
    detail, _ = await _shown((80, 24), "done")
    assert "queue 1397ms+4 chunks 152ms, preempted ×1" in detail, detail
    detail, _ = await _shown((120, 40), "done")      # the total where it fits
    assert "TTFT 1550ms=queue 1397ms+4 chunks 152ms (preempted ×1)" in detail, detail


@sync
async def test_a_preempted_rows_note_is_whole_in_the_request_list():
    _, row = await _shown((80, 24), "now")
    assert "preempted  ×1 " in row and "…" not in row, row
    _, row = await _shown((120, 40), "now")
    assert "×1: recompute" in row and "…" not in row, row


@sync
async def test_a_swapped_rows_note_says_it_waits_in_the_host_tier():
    """Under preemption_mode=swap with a host tier the request reloads its KV: its row
    said 'recompute' like every preempted row."""
    _, row = await _shown((120, 40), "swp")
    assert "×1: swapped" in row and "recompute" not in row, row


@sync
async def test_a_wide_list_shows_whole_ids():
    """At 200x60 the id column kept 7 cells (`…j-1147`) beside a 40-cell progress bar and
    empty room: what progress cannot use goes to the id, up to 16 cells."""
    from roseplay.tui.widgets.requests import ID_MAX
    long_id = "w0yjj-1147"
    for size, whole in (((200, 60), True), ((80, 24), False)):
        app = RoseplayApp(source=StaticSource(dataclasses.replace(
            _snapshot(), requests=tuple(dataclasses.replace(r, request_id=f"{long_id}{i}")
                                        for i, r in enumerate(_snapshot().requests)))))
        async with app.run_test(size=size) as pilot:
            app.refresh_panels()
            await pilot.pause()
            text = widget_text(app.requests)
            widths = app.requests._widths(app.requests.columns())
        assert (f" {long_id}1 " in text) == whole, text
        assert widths[0] == (ID_MAX if whole else 8), widths     # (its tag: `…j-11470`)

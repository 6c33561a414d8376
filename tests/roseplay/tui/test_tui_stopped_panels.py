"""The panels once the engine stopped for good: the snapshot on screen is its last one,
so nothing reads as happening now. Rates and counts of now are blanked (tok/s, the
plots' latest values, the KV legend's last 10 s, the events' eviction rate), requests
in flight read cut off with how far they got, the time axis ends at the stop, and the
panels carry the caption "as of step N · engine stopped". Checked on the rendered text."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.compare import CompareReplaySource
from roseplay.tui.compare_app import CompareApp
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.kv_panel import KVPanel
from roseplay.tui.widgets.request_detail import RequestDetail
from roseplay.tui.widgets.requests import RequestList
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.step import StepPanel
from roseplay.tui.widgets.timing import TimingPanel
from roseplay.workload.replay import Recording
from tests.roseplay.tui.helpers import DATA, SESSION, seen_in, sync, wait_for, widget_text
from tests.roseplay.tui.test_tui_stopped import (AS_IF_ONGOING, RATE, SIGTERMED, DownSource,
                                                 request_rows)

pytestmark = pytest.mark.timeout(120)

PER_SECOND = re.compile(r"\d+/s\b")


def _text(app, cls) -> str:
    return seen_in(app, app.query_one(cls))


def _stop(src) -> None:
    src.loop.unavailable = src.loop.fatal_error = SIGTERMED


async def _feed(pilot, app, src, frames) -> None:
    """Serve the recording's frames one after another, each drawn before the next
    (paused: the Timing panel redraws every new snapshot, no throttle)."""
    for snap in frames:
        src.snap = snap
        assert await wait_for(pilot, lambda: app.snapshot is snap)


@sync
async def test_after_the_stop_no_panel_reads_the_last_snapshot_as_live():
    frames = [Recording(SESSION)[i].snapshot for i in range(0, 31, 3)]
    last = frames[-1]
    src = DownSource(frames[0])
    src.paused = True
    app = RoseplayApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        await _feed(pilot, app, src, frames)
        timing = lambda: _text(app, TimingPanel)       # noqa: E731
        assert await wait_for(pilot, lambda: RATE.search(timing()) and not
                              RATE.search(timing()).group().startswith("0 "))
        before = timing()
        assert re.search(r"tok/s \d", before) and "now" in before     # the plot, the axis
        assert any("decoding" in row for row in request_rows(app))
        assert PER_SECOND.search(_text(app, KVPanel))                 # evicted N/s

        _stop(src)          # the same snapshot: only the client's state changed
        caption = f"as of step {last.step} · engine stopped"
        assert await wait_for(pilot, lambda: caption in timing()), timing()
        assert "■ STOPPED" in _text(app, StatusBar)

        after = timing()                  # no rate of now; the bars end at the stop
        assert not RATE.search(after) and "— tok/s" in after
        assert not re.search(r"tok/s \d", after) and "tok/s —" in after
        assert "stop" in after and "now" not in after
        assert "TTFT" in after and "ms" in after      # the window's latencies stand

        rows = request_rows(app)
        assert rows and any("cut off" in row for row in rows)
        assert not [row for row in rows if AS_IF_ONGOING.search(row)], rows
        assert f"step {last.step} · engine stopped" in _text(app, RequestList)   # (short)

        detail = _text(app, RequestDetail)
        assert "[cut off while decoding]" in detail and "▌" not in detail

        kv = _text(app, KVPanel)
        assert not PER_SECOND.search(kv) and "— the engine stopped" in kv
        assert f"in use {last.num_used}/" in kv and caption in kv     # as of the stop

        step = _text(app, StepPanel)
        assert f"last step {last.step}" in step and "running" not in step
        assert caption in step

        events = _text(app, EventLog)
        assert "■ stopped" in events and not PER_SECOND.search(events)
        assert app.screen.has_class("-stopped")


@sync
async def test_requests_that_waited_or_prefilled_read_cut_off_with_where_they_stood():
    first = Recording(SESSION)[0].snapshot       # waiting, prefilling and decoding rows
    assert {"waiting", "prefilling", "decoding"} <= {r.state for r in first.requests}
    src = DownSource(first)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(120, 60)) as pilot:
        assert await wait_for(pilot, lambda: "waiting" in "\n".join(request_rows(app)))
        _stop(src)
        assert await wait_for(pilot, lambda: "engine stopped" in _text(app, RequestList))
        rows = request_rows(app)
        assert len(rows) == len(first.requests)
        assert all(row.split()[1:3] == ["cut", "off"] for row in rows), rows   # the state
        assert not [row for row in rows if AS_IF_ONGOING.search(row)], rows
        assert any("was waiting" in row for row in rows)
        assert any("chunk" in row for row in rows)         # how far a prefill got
        waiting = next(r for r in first.requests if r.state == "waiting")
        app.requests.select(waiting.request_id)
        assert await wait_for(pilot, lambda: "[cut off while waiting]"
                              in _text(app, RequestDetail))
        detail = _text(app, RequestDetail)
        assert "before the stop" in detail and "so far" not in detail


class StoppableCompare:
    """A paused compare replay that reads as two live engines whose clients can stop."""

    kind = "live"

    def __init__(self):
        self._replay = CompareReplaySource(f"{DATA}/compare_session.jsonl.gz",
                                           start_paused=True)
        self.sides = [SimpleNamespace(loop=SimpleNamespace(unavailable=None, fatal_error=None))
                      for _ in range(2)]

    def __getattr__(self, name):
        return getattr(self._replay, name)


@sync
async def test_compare_a_stopped_side_reads_stopped_and_only_its_own():
    src = StoppableCompare()
    app = CompareApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(30):             # frames on: rates in the 10 s window
            src._replay.step_once()
        heads = lambda: [widget_text(h) for h in app.heads]      # noqa: E731
        assert await wait_for(pilot, lambda: all(" step " in h for h in heads()))
        loop = src.sides[1].loop
        loop.unavailable = loop.fatal_error = SIGTERMED
        assert await wait_for(pilot, lambda: "■ stopped after step" in heads()[1])
        step_b = src.snapshots()[1].step
        a, b = (seen_in(app, t) for t in app.timings)
        assert f"as of step {step_b} · engine stopped" in b and "— tok/s" in b
        assert "engine stopped" not in a and RATE.search(a)
        assert "stopped" not in heads()[0] and "engine stopped" not in seen_in(app, app.kvs[0])
        assert f"as of step {step_b} · engine stopped" in seen_in(app, app.kvs[1])
        rows = [line.strip("│ ").split() for line in widget_text(app.ratios).splitlines()]
        b_row = next(cells for cells in rows if cells[:1] == ["B"])
        assert b_row[3] == "-"           # TTFT p50, TPOT p50, then tok/s: none of now
        assert "B: the engine process got SIGTERM" in widget_text(app.status)


def test_a_dead_replica_shows_no_load_or_rate_of_now():
    from roseplay.tui.widgets.replica_load import ReplicaFigures
    from roseplay.tui.widgets.replica_maps import load_text
    f = ReplicaFigures(rank=1, alive=False, waiting=3, running=4, used=10, total=96,
                       hit_rate=0.5, ttft_p50=0.1, tok_s=300.0, routed=5)
    text = load_text(f, 60).plain
    assert "dead" in text and "300" not in text and "— tok/s" in text
    assert "waiting — · running — · 4w+r —" in text and "KV 10/96" in text
    alive = load_text(ReplicaFigures(**{**f.__dict__, "alive": True}), 60).plain
    assert "300 tok/s" in alive and "waiting 3 · running 4 · 4w+r 16" in alive


def test_each_compared_side_has_its_own_state():
    from roseplay.tui.engine_state import SERVING, side_downs
    src = StoppableCompare()
    assert side_downs(src) == [SERVING, SERVING]
    src.sides[0].loop.unavailable = src.sides[0].loop.fatal_error = SIGTERMED
    assert side_downs(src) == [(SIGTERMED, True), SERVING]
    assert side_downs(src._replay) == [SERVING, SERVING]          # a replay serves


def test_the_caption_comes_first_and_is_never_cut():
    from roseplay.tui.widgets.stopped import with_caption
    words = "0-173 of 512: scroll, z"
    assert with_caption(None, words, 32) == words                       # serving
    assert with_caption(7, words, 80) == f"as of step 7 · engine stopped · {words}"
    assert with_caption(7, words, 56) == f"step 7 · engine stopped · {words}"
    assert with_caption(7, words, 50) == f"stopped at 7 · {words}"
    assert with_caption(7, words, 32) == "step 7 · engine stopped"      # no cut word
    assert with_caption(7, "", 20) == "stopped at 7"
    assert with_caption(7, words, 32, keep_words=True) == words   # the KV map's range

"""The top line once the engine cannot serve: a dead engine's last snapshot carries no
error, so the status bar reads the client's state (roseplay/tui/engine_state.py) and
shows STOPPED with the reason in place of SERVING or PAUSED; the engine process that
died is reaped while the app runs on, and the panels stop reading its last snapshot as
live (test_tui_stopped_panels.py has each panel)."""
from __future__ import annotations

import os
import re
import signal
from types import SimpleNamespace

import pytest

from devtools.procs import process_state
from roseplay.tui.app import RoseplayApp
from roseplay.tui.engine_state import client_down, engine_down
from roseplay.tui.widgets.requests import RequestList
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.timing import TimingPanel
from tests.roseplay.tui.helpers import (StaticSource, fast_idle, live_source, seen_in,
                                        session_snapshot, sync, wait_for, widget_text)

pytestmark = pytest.mark.timeout(150)

SIGTERMED = "the engine process got SIGTERM"
RATE = re.compile(r"\d[\d,]* tok/s")      # a throughput figure ("— tok/s" once stopped)
IN_FLIGHT = ("waiting", "prefilling", "decoding", "preempted", "dedup", "compiling")
AS_IF_ONGOING = re.compile(rf"(?<!was )\b({'|'.join(IN_FLIGHT)})\b")   # "was waiting": past


class DownSource(StaticSource):
    """A live source over one built snapshot whose client can be made to stop."""

    kind = "live"
    paused = False

    def __init__(self, snap):
        super().__init__(snap)
        self.loop = SimpleNamespace(unavailable=None, fatal_error=None)

    def replicas(self):
        return None


def _top(app) -> str:
    return widget_text(app.query_one(StatusBar))


def request_rows(app) -> list[str]:
    """The request list's rows as on screen: under its top border and header."""
    lines = seen_in(app, app.query_one(RequestList)).splitlines()[2:-1]
    return [line.strip("│ ") for line in lines if line.strip("│ ")]


def live_rate(text: str) -> bool:
    """A throughput above 0 reads in `text`."""
    found = RATE.search(text)
    return found is not None and found.group() != "0 tok/s"


def test_the_client_state_says_stopped_or_only_unavailable():
    assert client_down(SimpleNamespace(unavailable=None, fatal_error=None)) == ("", False)
    assert client_down(SimpleNamespace(unavailable=SIGTERMED, fatal_error=SIGTERMED)) \
        == (SIGTERMED, True)
    again = "attaching to the engine again (no heartbeat)"
    assert client_down(SimpleNamespace(unavailable=again, fatal_error=None)) == (again, False)
    assert engine_down(StaticSource(session_snapshot(12))) == ("", False)   # a replay
    sides = [SimpleNamespace(loop=SimpleNamespace(unavailable=None, fatal_error=None)),
             SimpleNamespace(loop=SimpleNamespace(unavailable=SIGTERMED,
                                                  fatal_error=SIGTERMED))]
    assert engine_down(SimpleNamespace(kind="live", sides=sides)) == (f"B: {SIGTERMED}", True)


@sync
async def test_the_top_line_reads_stopped_and_why_in_place_of_serving_or_paused():
    snap = session_snapshot(12)
    src = DownSource(snap)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: "▶ SERVING" in _top(app))
        src.loop.unavailable = src.loop.fatal_error = SIGTERMED
        # the same snapshot object and no key: the timer redraws for the client's state
        assert await wait_for(pilot, lambda: "■ STOPPED" in _top(app))
        top = _top(app)
        assert SIGTERMED in top and "SERVING" not in top and "PAUSED" not in top
        assert top.index("STOPPED") < top.index(f"step {snap.step}")   # first, then the step
        src.paused = True                       # paused when it died: stopped all the same
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: "PAUSED" not in _top(app)
                              and "■ STOPPED" in _top(app))
        # a client attaching again (no fatal error): the app's own timer draws it, as it
        # drew STOPPED (a direct StatusBar.show could be redrawn over by that timer)
        src.loop.fatal_error, src.loop.unavailable = None, "attaching to the engine again (x)"
        assert await wait_for(pilot, lambda: "◌ UNAVAILABLE" in _top(app))
        top = _top(app)
        assert "attaching to the engine again" in top
        assert "STOPPED" not in top and "SERVING" not in top




@sync
async def test_a_killed_engine_process_reads_stopped_and_is_reaped_while_the_app_runs(
        monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(in_process=False)
    proc = src.loop.proc
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(80, 24)) as pilot:
            timing = lambda: seen_in(app, app.query_one(TimingPanel))     # noqa: E731
            assert await wait_for(pilot, lambda: src.snapshot().step > 0
                                  and "▶ SERVING" in _top(app) and live_rate(timing()), 60)
            os.kill(proc.pid, signal.SIGTERM)
            assert await wait_for(pilot, lambda: "■ STOPPED" in _top(app), 60), _top(app)
            top = _top(app)
            assert "SERVING" not in top and src.loop.fatal_error
            assert src.loop.fatal_error[:20] in top      # the reason (80 columns cut its end)
            # the panels: no throughput of now, no request reads as still in flight
            assert await wait_for(pilot, lambda: "engine stopped" in timing()), timing()
            assert not RATE.search(timing()) and "— tok/s" in timing()
            assert not [row for row in request_rows(app) if AS_IF_ONGOING.search(row)]
            assert await wait_for(pilot, lambda: proc.returncode is not None, 60)
            assert process_state(proc.pid) != "Z" and app.is_running and app.return_code is None
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        src.close()
        src.loop.close()                        # again: a no-op
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None and process_state(proc.pid) != "Z"

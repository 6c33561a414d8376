"""The top line once the engine cannot serve: a dead engine's last snapshot carries no
error, so the status bar reads the client's state (roseplay/tui/engine_state.py) and
shows STOPPED with the reason in place of SERVING or PAUSED; the engine process that
died is reaped while the app runs on."""
from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.engine_state import client_down, engine_down
from roseplay.tui.widgets.status import StatusBar
from tests.roseplay.tui.helpers import (StaticSource, fast_idle, live_source,
                                        session_snapshot, sync, wait_for, widget_text)

pytestmark = pytest.mark.timeout(150)

SIGTERMED = "the engine process got SIGTERM"


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
        status = app.query_one(StatusBar)
        status.show(snap, "live", False, unavailable="attaching to the engine again (x)")
        await pilot.pause()
        top = _top(app)
        assert "◌ UNAVAILABLE" in top and "attaching to the engine again" in top
        assert "STOPPED" not in top and "SERVING" not in top


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@sync
async def test_a_killed_engine_process_reads_stopped_and_is_reaped_while_the_app_runs(
        monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(in_process=False)
    proc = src.loop.proc
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(80, 24)) as pilot:
            assert await wait_for(pilot, lambda: src.snapshot().step > 0
                                  and "▶ SERVING" in _top(app), 60)
            os.kill(proc.pid, signal.SIGTERM)
            assert await wait_for(pilot, lambda: "■ STOPPED" in _top(app), 60), _top(app)
            top = _top(app)
            assert "SERVING" not in top and src.loop.fatal_error
            assert src.loop.fatal_error[:20] in top      # the reason (80 columns cut its end)
            assert await wait_for(pilot, lambda: proc.returncode is not None, 60)
            assert _state(proc.pid) != "Z" and app.is_running and app.return_code is None
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        src.close()
        src.loop.close()                        # again: a no-op
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None and _state(proc.pid) != "Z"

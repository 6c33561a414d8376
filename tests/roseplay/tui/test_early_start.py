"""roseplay/tui/early_start.py: the TUI's source starts before the app exists, the app's
factory gets it (or its error), a source the app never took is closed, and the module
imports no Textual (it runs before the app is imported); the threads that start the engine
end with the load and the engine outlives them."""
import subprocess
import sys
import threading
import time

import pytest

from roseplay.tui.early_start import EarlyStart


class FakeSource:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_the_factory_runs_at_once_and_the_app_gets_its_source():
    started, source = threading.Event(), FakeSource()

    def factory():
        started.set()
        return source
    early = EarlyStart(factory)
    assert started.wait(5)                     # before anyone asked for it
    assert early() is source and early.taken
    early.release()
    assert not source.closed                   # the app owns it: the app closes it


def test_an_error_reaches_the_app_and_an_untaken_source_is_closed():
    def broken():
        raise ValueError("no such model")
    early = EarlyStart(broken)
    with pytest.raises(ValueError, match="no such model"):
        early()
    early.release()
    source = FakeSource()
    untaken = EarlyStart(lambda: source)
    untaken._ready.wait(5)
    untaken.release()                          # the app quit before loading it
    assert source.closed


def test_the_module_imports_no_textual_and_no_torch():
    code = ("import sys, roseplay.tui.early_start, roseplay.cli; "
            "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_engine_outlives_the_thread_that_started_it():
    """The start thread ends once the source is built (it used to stay asleep until the
    app quit, for the engine's PR_SET_PDEATHSIG); the engine process steps on past the
    time its SIGTERM would have stopped it."""
    from engine.ipc.core_proc import SIGTERM_GRACE_S
    from tests.roseplay.tui.helpers import live_source

    early = EarlyStart(lambda: live_source(in_process=False))
    source = early()
    try:
        starter = next((t for t in threading.enumerate() if t.name == "roseplay-start"), None)
        if starter is not None:
            starter.join(10)
            assert not starter.is_alive()
        proc = source.loop.proc
        step = source.snapshot().step
        until, give_up = time.monotonic() + SIGTERM_GRACE_S + 2.0, time.monotonic() + 120
        while time.monotonic() < until or source.snapshot().step <= step + 3:
            assert time.monotonic() < give_up, "the engine stopped stepping"
            assert proc.poll() is None, "the engine process ended with its starting thread"
            time.sleep(0.1)
        assert proc.poll() is None
    finally:
        early.release()
        source.close()


def test_the_apps_load_thread_ends_and_its_engine_serves_on():
    """The app's loader thread (roseplay-load) ends once the source is built; it stayed
    asleep until the app quit. The engine it started steps on after it ended."""
    import asyncio

    from engine.ipc.core_proc import SIGTERM_GRACE_S
    from roseplay.tui.app import RoseplayApp
    from tests.roseplay.tui.helpers import live_source, wait_for

    async def run():
        app = RoseplayApp(source_factory=lambda: live_source(in_process=False))
        async with app.run_test(size=(80, 24)) as pilot:
            assert await wait_for(pilot, lambda: app.source is not None, 120)
            loaders = [t for t in threading.enumerate() if t.name == "roseplay-load"]
            assert await wait_for(pilot, lambda: not any(t.is_alive() for t in loaders), 10)
            proc, step = app.source.loop.proc, app.source.snapshot().step
            until = time.monotonic() + SIGTERM_GRACE_S + 2.0
            assert await wait_for(pilot, lambda: time.monotonic() > until and
                                  app.source.snapshot().step > step + 3, 120)
            assert proc.poll() is None
    asyncio.run(run())

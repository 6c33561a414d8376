"""CoreLoop.stop (engine/core/core_loop.py) from the loop's own thread while the loop
holds its wake lock: what the engine process's SIGTERM handler does when the signal
lands inside `_wake.wait`. It took that lock again (`Event.set`) and the process hung
for good, a later SIGTERM included (found as an orphan engine process after a test)."""
import threading

from engine.commands import Barrier
from engine.front.loop import EngineLoop


def test_a_stop_on_the_loops_thread_holding_its_wake_lock_ends_the_loop():
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as loop:
        core, stopped = loop.transport.core, threading.Event()

        def handler(_snapshot):            # on the loop's thread, as a signal handler runs
            with core._wake._cond:         # the lock Event.wait holds while it re-acquires
                core.stop()
            stopped.set()
        core.post(Barrier(1), handler)
        assert stopped.wait(30), "stop() waited for the lock its own thread holds"
        loop.transport.thread.join(30)
        assert not loop.transport.thread.is_alive() and core.stopped

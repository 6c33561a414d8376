"""Starts the TUI's source before Textual is imported: the engine process (torch, the
model) loads on the other core while the app imports Textual and composes its screen,
instead of after (about half a second of a 2-core laptop's start-up).

Imports neither textual nor torch. The thread that builds the source ends with the
build: engine processes are forked from a thread that lives as long as the process
(engine/ipc/launch.py spawn), so their PR_SET_PDEATHSIG does not fire when it ends.
"""
from __future__ import annotations

import threading
from typing import Callable


LOAD_WAIT_S = 5.0       # a quit during the load waits this long at most for it to end
ENGINE_MODULE = "engine.ipc.core_proc"    # the engine process's `python -m` module


def stop_loading_engines() -> list[int]:
    """SIGTERM this process's engine children (a quit during the load): the client
    waiting for one sees it end, fails at once and removes the engine's /tmp folder,
    instead of the interpreter's exit killing that thread halfway (the folder stayed)."""
    import os
    import signal
    me, stopped = os.getpid(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if ENGINE_MODULE.encode() not in fh.read():
                    continue
            os.kill(int(entry), signal.SIGTERM)
            stopped.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue        # gone meanwhile, or not ours to read
    return stopped


class EarlyStart:
    """`factory()` running from now on, on a thread of its own; calling this object (the
    app's source factory, from its loader thread) waits for it and returns its source
    or raises its error."""

    def __init__(self, factory: Callable[[], object]):
        self._ready = threading.Event()
        self.source, self.error, self.taken = None, None, False
        self._lock, self._closing = threading.Lock(), False
        threading.Thread(target=self._run, args=(factory,), name="roseplay-start",
                         daemon=True).start()

    def _run(self, factory: Callable[[], object]) -> None:
        try:
            self.source = factory()
        except Exception as exc:          # re-raised to the app's loader
            self.error = exc
        self._ready.set()

    def __call__(self):
        self._ready.wait()
        with self._lock:
            if self._closing:           # the app has gone: release() closes it
                raise RuntimeError("the app quit during the load")
            self.taken = True
        if self.error is not None:
            raise self.error
        return self.source

    def release(self, wait: float = LOAD_WAIT_S) -> None:
        """After the app: close a source it never took (it failed before loading, or quit
        first). A quit during the load stops the engine process
        being started and waits (up to `wait` s) for its client to clean up."""
        if not self.taken and not self._ready.is_set():
            stop_loading_engines()      # its client then fails, and removes its folder
            self._ready.wait(wait)
        with self._lock:
            self._closing = True
            mine = self._ready.is_set() and not self.taken
        if mine and self.source is not None:
            self.source.close()

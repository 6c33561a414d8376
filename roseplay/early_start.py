"""Starts the TUI's source before Textual is imported: the engine process (torch, the
model) loads on the other core while the app imports Textual and composes its screen,
instead of after (about half a second of a 2-core laptop's start-up).

Imports neither textual nor torch. The thread that built the source stays (asleep)
until `release()`: the engine process has PR_SET_PDEATHSIG, which Linux fires when the
parent *thread* ends (roseplay/lifecycle.py).
"""
from __future__ import annotations

import threading
from typing import Callable


class EarlyStart:
    """`factory()` running from now on, on a thread of its own; calling this object (the
    app's source factory, from its loader thread) waits for it and returns its source
    or raises its error."""

    def __init__(self, factory: Callable[[], object]):
        self._ready, self._release = threading.Event(), threading.Event()
        self.source, self.error, self.taken = None, None, False
        threading.Thread(target=self._run, args=(factory,), name="roseplay-start",
                         daemon=True).start()

    def _run(self, factory: Callable[[], object]) -> None:
        try:
            self.source = factory()
        except Exception as exc:          # re-raised to the app's loader
            self.error = exc
        self._ready.set()
        self._release.wait()

    def __call__(self):
        self._ready.wait()
        self.taken = True
        if self.error is not None:
            raise self.error
        return self.source

    def release(self) -> None:
        """After the app: close a source it never took (it failed before loading, or quit
        first), and let the thread end."""
        if self._ready.is_set() and not self.taken and self.source is not None:
            self.source.close()
        self._release.set()

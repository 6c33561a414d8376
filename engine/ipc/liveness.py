"""Silence counted in time the judging process ran: the one stall policy of both ends.

The engine judges a client gone, and a client judges the engine gone, after
`client_timeout` seconds (EngineConfig) without a message from the other. Only time the
judge itself ran counts: when two of its checks are more than STALL_GAP apart (the
process was stopped with SIGSTOP, swapped out, or starved), every clock it keeps
restarts, since the other side's messages of that time may still be on their way in.
Silence is judged after what was queued has been read, so a stall of either end shorter
than `client_timeout` ends nothing (docs/RELIABILITY.md "Liveness").
"""
from __future__ import annotations

import time

STALL_GAP = 1.0            # seconds between two checks (normally 0.1) that mean we were not running
HEARTBEAT_INTERVAL = 0.5          # a client's heartbeat
ENGINE_HEARTBEAT_INTERVAL = 1.0   # the engine's, to every client (engine/ipc/core_output.py)


class StallClock:
    """Ticks of one judging thread; `tick()` says whether it just came back from a stall."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def tick(self) -> tuple[float, bool]:
        now = time.monotonic()
        stalled, self._last = now - self._last > STALL_GAP, now
        return now, stalled


class Silence:
    """How long one peer (the engine, seen from a client) has been silent."""

    def __init__(self, timeout: float):
        self.timeout = float(timeout)
        self._clock = StallClock()
        self._heard = time.monotonic()

    def heard(self) -> None:
        self._heard = time.monotonic()

    def expired(self) -> bool:
        """True once the peer said nothing for `timeout` seconds of our running time."""
        now, stalled = self._clock.tick()
        if stalled:
            self._heard = now
        return now - self._heard > self.timeout

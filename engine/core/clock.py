"""The serving clock: perf_counter time that stops while the engine is paused.

Every engine timestamp (arrivals, token times, step times) is on this clock, so a
pause never counts as latency: TTFT, TPOT and ITL measure serving, not the time a
learner spent looking at a paused screen. In single-step mode the clock runs only
during each step, so a stepped request's ITLs are the engine's step times.
"""
from __future__ import annotations

import time


class ServingClock:
    def __init__(self):
        self._offset = 0.0            # paused seconds so far (completed pauses)
        self._paused_at: float | None = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def now(self) -> float:
        raw = self._paused_at if self._paused_at is not None else time.perf_counter()
        return raw - self._offset

    def to_serving(self, raw: float) -> float:
        """A perf_counter reading (e.g. a client's arrival stamp) on this clock."""
        if self._paused_at is not None and raw >= self._paused_at:
            raw = self._paused_at
        return raw - self._offset

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._offset += time.perf_counter() - self._paused_at
            self._paused_at = None

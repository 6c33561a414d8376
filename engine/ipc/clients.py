"""ClientTable: the clients of an engine process that showed the engine key, when each
was last heard, and whose pause holds.

Why a stall never kills a client: silence is judged after the input thread has read
what was queued, and when the judging thread itself did not run for STALL_GAP seconds
(the process was stopped, or starved), every client's clock restarts: their heartbeats
of that time may still be on their way in. Only the input thread changes the table; the
output thread reads a copy of its members.
"""
from __future__ import annotations

import time

STALL_GAP = 1.0    # seconds between two checks (normally 0.1) that mean we were not running


class ClientTable:
    def __init__(self, timeout: float):
        self.timeout = float(timeout)
        self._seen: dict[bytes, float] = {}       # identity -> last message (monotonic)
        self.paused_by: bytes | None = None       # the client whose pause holds
        self._last_check = time.monotonic()

    def __contains__(self, client: bytes) -> bool:
        return client in self._seen

    def members(self) -> tuple[bytes, ...]:
        return tuple(self._seen)

    def admit(self, client: bytes) -> None:
        self._seen[client] = time.monotonic()

    def heard(self, client: bytes) -> None:
        if client in self._seen:
            self._seen[client] = time.monotonic()

    def remove(self, client: bytes) -> tuple[bool, bool]:
        """Forget a client: (it was a member, its pause held)."""
        member = self._seen.pop(client, None) is not None
        held = member and self.paused_by == client
        if held:
            self.paused_by = None
        return member, held

    def silent(self) -> list[bytes]:
        """The clients not heard for `timeout` seconds of this process's running time."""
        now = time.monotonic()
        if now - self._last_check > STALL_GAP:
            for client in self._seen:
                self._seen[client] = now
        self._last_check = now
        return [c for c, seen in self._seen.items() if now - seen > self.timeout]

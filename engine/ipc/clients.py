"""ClientTable: the clients of an engine process that attached (said Hello past the
CURVE handshake, engine/ipc/curve.py), when each was last heard, and whose pause holds.

A client silent for `client_timeout` seconds of this process's running time is judged
gone (engine/ipc/liveness.py: a stall of the engine itself never counts). Only the
input thread changes the table; the output thread reads a copy of its members.
"""
from __future__ import annotations

import time

from engine.ipc.liveness import StallClock


class ClientTable:
    def __init__(self, timeout: float):
        self.timeout = float(timeout)
        self._seen: dict[bytes, float] = {}       # identity -> last message (monotonic)
        self.paused_by: bytes | None = None       # the client whose pause holds
        self._clock = StallClock()

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
        now, stalled = self._clock.tick()
        if stalled:
            for client in self._seen:
                self._seen[client] = now
        return [c for c, seen in self._seen.items() if now - seen > self.timeout]

"""Graceful shutdown: drain the open generations, then end the rest with an error.

`Drain` knows every Generation the routes have open (streams and plain requests). On
SIGTERM the server (server.py) stops accepting, calls `begin()` (new requests on a
kept-alive connection then get 503), waits up to --shutdown-timeout for the open ones
to finish, and `cut()`s what is left: each unfinished choice ends with an OpenAI-format
error (a stream gets an error event and `data: [DONE]`) and its engine request is
cancelled, so no client waits on a server that is going away.
"""
from __future__ import annotations

import asyncio
import time
import weakref

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0     # as Kubernetes' default terminationGracePeriodSeconds
SHUTDOWN_MESSAGE = "the server is shutting down; retry on another replica or later"
EXIT_DRAINED, EXIT_CUT, EXIT_ENGINE_DIED = 0, 3, 4     # `roseplay serve` exit codes


class Drain:
    def __init__(self) -> None:
        self.draining = False
        # every Generation the routes started (a closed one is done; the set forgets
        # it once it is garbage)
        self.open: weakref.WeakSet = weakref.WeakSet()
        self.cut_count = 0     # choices ended by cut(), and responses cut unsent (server.py)

    def add(self, gen) -> None:
        self.open.add(gen)

    def begin(self) -> None:
        self.draining = True

    async def wait(self, timeout: float, give_up=lambda: False, unsent=lambda: 0) -> bool:
        """Wait until every open generation is done, its stream written and `unsent()`
        (connections with response bytes not yet sent) is 0 (True), or `timeout` passed
        or `give_up()` (a second Ctrl-C) holds (False). A stream whose events are all
        read may still have megabytes to go to a slow client."""
        deadline = time.monotonic() + timeout
        while any(not g.done or g.writing for g in self.open) or unsent():
            if time.monotonic() >= deadline or give_up():
                return False
            await asyncio.sleep(0.05)
        return True

    def cut(self, message: str = SHUTDOWN_MESSAGE) -> int:
        """End every unfinished choice with an error event; returns how many."""
        n = sum(g.end_with_error(message, status=503) for g in list(self.open) if not g.done)
        self.cut_count += n
        return n

"""When an engine process stops on SIGTERM (engine/ipc/core_proc.py): at once without an
owner; an owned one waits SIGTERM_GRACE_S for its owner's Draining (the signal may have
gone to the whole group, the owner too), then serves the announced drain up to its end.
The whole path, a real server's group signalled with streams open, is
tests/roseplay/serve/test_serve_shutdown.py::test_sigterm_to_the_whole_group_..."""
from __future__ import annotations

import time
from types import SimpleNamespace

from engine.ipc import protocol as P
from engine.ipc.core_proc import SIGTERM_GRACE_S, SIGTERM_REASON, EngineCoreProc


def _proc(owner_pid=123, token="t"):
    stops: list[str] = []
    proc = SimpleNamespace(owner_pid=owner_pid, owner_token=token, _sigterm_at=None,
                           _drain_until=None, stop=stops.append)
    return proc, stops


def _signal(proc, ago: float = 0.0) -> None:
    EngineCoreProc.on_sigterm(proc)
    if proc._sigterm_at is not None:
        proc._sigterm_at -= ago


def test_without_an_owner_sigterm_stops_at_once():
    proc, stops = _proc(owner_pid=None)
    _signal(proc)
    assert stops == [SIGTERM_REASON]


def test_an_owned_engine_waits_the_grace_for_a_drain_then_stops():
    proc, stops = _proc()
    _signal(proc)
    EngineCoreProc._check_sigterm(proc)
    assert stops == []                              # the owner may be about to drain
    proc._sigterm_at -= SIGTERM_GRACE_S
    EngineCoreProc._check_sigterm(proc)
    assert stops == [SIGTERM_REASON]


def test_an_announced_drain_is_served_to_its_end():
    proc, stops = _proc()
    EngineCoreProc._draining(proc, b"owner", P.Draining(30.0, "t"))
    _signal(proc, ago=10 * SIGTERM_GRACE_S)          # long past the grace
    EngineCoreProc._check_sigterm(proc)
    assert stops == []
    proc._drain_until = time.monotonic() - 0.01     # the drain's end passed: no Shutdown
    EngineCoreProc._check_sigterm(proc)
    assert stops == [SIGTERM_REASON]


def test_a_drain_without_the_owners_token_changes_nothing():
    proc, stops = _proc()
    EngineCoreProc._draining(proc, b"other", P.Draining(30.0, "not the token"))
    assert proc._drain_until is None
    _signal(proc, ago=SIGTERM_GRACE_S)
    EngineCoreProc._check_sigterm(proc)
    assert stops == [SIGTERM_REASON]

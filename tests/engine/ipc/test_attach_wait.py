"""Attaching to an address where no engine answers: the wait is reported, then ends with
EngineDied naming the address (a front must not wait silently for an engine that may
never come)."""
from __future__ import annotations

import pytest

from engine.front.client import EngineClient
from engine.ipc import attach
from engine.ipc.launch import EngineDied
from tests.helpers import free_port_block


def test_an_unanswered_attach_says_so_and_ends(monkeypatch):
    monkeypatch.setattr(attach, "WAIT_REPORT_S", 0.3)
    address = f"tcp://127.0.0.1:{free_port_block(3)}"
    heard: list[str] = []
    with pytest.raises(EngineDied, match=address):
        EngineClient(connect=address, engine_key="", startup_timeout=1.5,
                     on_progress=heard.append)
    assert heard, "the wait was never reported"
    assert all(address in h and "roseplay serve --headless" in h for h in heard)
    assert heard[0].startswith(f"no engine answers at {address} yet")

"""The server most HTTP tests here talk to: the bundled model's engine in its own
process behind `roseplay serve`'s app on 127.0.0.1, one per test module (a module that
needs another engine or app defines its own `server` / `http`)."""
from __future__ import annotations

import httpx
import pytest

from engine.front.client import EngineClient
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread


@pytest.fixture(scope="module")
def server():
    with EngineClient(label="server", snapshots=False) as engine, \
            ServerThread(build_app(engine)) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client

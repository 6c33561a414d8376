"""Fixtures shared by the TUI tests (their helpers: tests/roseplay/tui/helpers.py)."""
from __future__ import annotations

import pytest

from tests.roseplay.tui.helpers import fast_idle, live_source


@pytest.fixture
def fast_pilot(monkeypatch):
    """Pilot's wait for an idle CPU capped (helpers.fast_idle says why): for the modules
    whose tests run a live engine (pytestmark = pytest.mark.usefixtures("fast_pilot"))."""
    fast_idle(monkeypatch)


@pytest.fixture
def source():
    """A live dummy engine with the helpers' defaults, closed after the test."""
    src = live_source()
    yield src
    src.close()


@pytest.fixture
def paused_source():
    """The same engine, paused: for a test of keys and screens that needs no step (the
    engine computes nothing while the app is driven), closed after the test."""
    src = live_source(paused=True)
    yield src
    src.close()

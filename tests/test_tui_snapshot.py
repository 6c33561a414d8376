"""SVG snapshots of the app in deterministic states: a paused replay of the committed
recording (tests/data/tui_session.jsonl.gz), so every number on screen is recorded data.

Update after an intended visual change: pytest tests/test_tui_snapshot.py --snapshot-update
"""
from __future__ import annotations

import pytest

from roseplay.app import RoseplayApp
from roseplay.source import ReplaySource
from tui_helpers import SESSION, SIZE

pytestmark = pytest.mark.timeout(120)


def _app() -> RoseplayApp:
    return RoseplayApp(source=ReplaySource(SESSION, start_paused=True))


def _keys(*keys):
    """Press keys one by one, redrawing from the source after each: the timing panel's
    history must see every replay frame, and the app's timer may skip frames (or not fire
    between two presses) on a loaded machine."""
    async def run(pilot):
        pilot.app.refresh_panels()          # the first frame, before any key
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            pilot.app.refresh_panels()
            await pilot.pause()
    return run


def test_snapshot_replay_mid_run(snap_compare):
    """Frame 13: shared-prefix with a 64-token budget, refcount-2 prefix blocks, decoding."""
    assert snap_compare(_app(), terminal_size=SIZE, run_before=_keys(*["n"] * 12))


def test_snapshot_replay_selected_request_and_small_terminal(snap_compare):
    """A smaller terminal (denser KV map), the second request selected."""
    assert snap_compare(_app(), terminal_size=(120, 36), run_before=_keys(*["n"] * 8, "down"))

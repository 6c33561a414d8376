"""SVG snapshots of the app in deterministic states: a paused replay of the committed
recording (tests/roseplay/tui/data/tui_session.jsonl.gz), so every number on screen is recorded data,
at 80x24 (panels hidden, and said so), 120x40 and 200x60; and one frame with engine
events (a COW and a preemption flashing on the map, listed in the event log).

Update after an intended visual change: pytest tests/roseplay/tui/test_tui_snapshot.py --snapshot-update
"""
from __future__ import annotations

import dataclasses

import pytest

from engine.codes import EV_COW, EV_PREEMPT
from engine.snapshot import EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.workload.source import ReplaySource
from tests.roseplay.tui.helpers import (SESSION, StaticSource, keys_redrawing, session_snapshot,
                                        steps_then_keys)

pytestmark = pytest.mark.timeout(120)


def _app() -> RoseplayApp:
    return RoseplayApp(source=ReplaySource(SESSION, start_paused=True))


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_replay_mid_run(snap_compare, size):
    """Frame 13: shared-prefix with a 64-token budget, refcount-2 prefix blocks, decoding;
    the second request selected."""
    assert snap_compare(_app(), terminal_size=size, run_before=steps_then_keys(12, "down"))


def test_snapshot_policy_knobs(snap_compare):
    """The knobs panel zoomed, with every policy knob away from its default (the last one
    touched explains itself underneath)."""
    snap = session_snapshot(12)
    knobs = snap.knobs.replace(scheduling_mode="mixed-chunk", scheduling_policy="lpm",
                               eviction_policy="lfu")
    source = StaticSource(dataclasses.replace(snap, knobs=knobs))
    source.kind = "live"                  # the help line of a live session, not a replay's
    app = RoseplayApp(source=source)

    async def run(pilot):
        pilot.app.knobs.last_changed = "scheduling_mode"
        pilot.app.set_zoom("knobs")
        await pilot.pause()
    assert snap_compare(app, terminal_size=(100, 20), run_before=run)


def test_snapshot_cow_and_preemption_events(snap_compare):
    snap = session_snapshot(12)
    freed = snap.request("w0-31").blocks
    events = (EngineEvent(snap.step - 1, snap.time, EV_COW, "w0-28", (0, 40)),
              EngineEvent(snap.step - 1, snap.time, EV_PREEMPT, "w0-31", freed))
    app = RoseplayApp(source=StaticSource(dataclasses.replace(snap, events=events)))
    assert snap_compare(app, terminal_size=(120, 40), run_before=keys_redrawing())

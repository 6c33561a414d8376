"""A paused app redraws its panels only when there is something new: a snapshot it has
not drawn, or a key, mouse or resize event (roseplay/tui/app.py `_unchanged`)."""
from __future__ import annotations

import dataclasses

import pytest

from roseplay.tui.app import RoseplayApp
from tests.roseplay.tui.helpers import SIZE, settle, sync, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fast_pilot")]


@sync
async def test_a_paused_app_redraws_on_a_new_snapshot_or_input_only(paused_source, monkeypatch):
    app = RoseplayApp(paused_source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, paused_source)
        frames = []
        real = app.refresh_panels

        def counted():
            frames.append(1)
            real()
        monkeypatch.setattr(app, "refresh_panels", counted)
        held = [paused_source.snapshot()]          # the engine's next republish, held back
        monkeypatch.setattr(paused_source, "snapshot", lambda: held[0])
        assert await wait_for(pilot, lambda: app.snapshot is held[0]), "never drew it"
        drawn = len(frames)
        await pilot.pause(0.5)                    # some timer ticks: nothing new
        assert len(frames) == drawn
        await pilot.hover("#requests")            # input: the next tick draws once
        assert await wait_for(pilot, lambda: len(frames) > drawn)
        drawn = len(frames)
        await pilot.pause(0.5)
        assert len(frames) == drawn
        held[0] = dataclasses.replace(held[0])   # published again: a new object
        assert await wait_for(pilot, lambda: app.snapshot is held[0]), "a new snapshot not drawn"

"""Data parallelism with a host KV tier: each replica's figures under its map end with
its host tier (blocks cached and swapped now, blocks copied to it and back), checked
against the replica's own snapshot (two dummy:tiny engine processes). The merged host map
gives way to the replica maps: without this line no replica's host tier was on screen."""
from __future__ import annotations

import re

import pytest

from roseplay.tui.app import RoseplayApp
from tests.roseplay.tui.helpers import ENGINE, fast_idle, sync, wait_for, widget_text

pytestmark = [pytest.mark.timeout(600)]


@pytest.mark.parametrize("size", ((80, 24), (120, 40), (200, 60)))
@sync
async def test_each_replica_shows_its_host_tier(size, monkeypatch):
    from roseplay.workload.source import start_live
    fast_idle(monkeypatch)
    src = start_live(dict(ENGINE, num_blocks=48, data_parallel_size=2,
                          routing_policy="round_robin", kv_offloading_size=0.01,
                          preemption_mode="swap"),
                     scenario="multi-turn", concurrency=8, input_len=48, output_len=24)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=size) as pilot:
            dp = src.replicas()
            assert await wait_for(pilot, lambda: all(
                s.counters.kv_offload_blocks for s in dp.replica_snapshots()), 120)
            src.pause()
            assert await wait_for(pilot, lambda: all(s.paused for s in dp.replica_snapshots()))
            steps = None
            while steps != [s.step for s in dp.replica_snapshots()]:
                steps = [s.step for s in dp.replica_snapshots()]
                await pilot.pause(0.3)
            app.refresh_panels()
            await pilot.pause()
            for r, snap in enumerate(dp.replica_snapshots()):
                text = widget_text(app.query_one(f"#replica-load-{r}"))
                line = next((x for x in text.splitlines() if x.lstrip().startswith("h")
                             and re.search(r"\d+c? ", x)), "")
                state = snap.host_block_state
                cached, swapped = int((state == 2).sum()), int((state == 1).sum())
                assert re.search(rf"\b{cached}(c| cached)\b.*\b{swapped}(s| swapped)\b",
                                 line), text
                c = snap.counters
                if "→" in line:
                    assert f"→{c.kv_offload_blocks} ←{c.kv_reload_blocks}" in line, text
    finally:
        src.close()

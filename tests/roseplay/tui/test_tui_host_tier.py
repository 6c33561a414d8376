"""The host KV tier on screen: a second, smaller map under the KV map with its blocks
(cached, swapped with their refcount) and its totals (copies each way, swaps, prefix hits
by tier), the last step's copies in the step panel; absent
without a host tier (the screen is the same as before)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.kv_host import HostTierView, host_line
from roseplay.tui.widgets.kv_map import CACHED, USED
from tests.roseplay.tui.helpers import (SIZE, StaticSource, screen_text, session_snapshot, sync,
                                        widget_text)

pytestmark = pytest.mark.timeout(120)


def with_host_tier(snap):
    state = np.array([2, 2, 1, 0, 0, 2] * 10, np.int8)         # 30 cached, 10 swapped
    refcount = (state == 1).astype(np.uint8)
    step = dataclasses.replace(snap.last_step, blocks_to_host=4, blocks_from_host=2,
                               bytes_to_host=4_000_000, bytes_from_host=2_000_000)
    return dataclasses.replace(snap, host_block_state=state, host_block_refcount=refcount,
                               kv_bytes_per_block=1_000_000, last_step=step)


@sync
async def test_the_host_tier_map_shows_under_the_kv_map_only_with_a_tier():
    base = session_snapshot(12)
    source = StaticSource(with_host_tier(base))
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(2):          # shown, laid out, then drawn at its width
            app.refresh_panels()
            await pilot.pause()
        view = app.query_one(HostTierView)
        assert view.display
        assert "host 60: 30 cached, 10 swapped · →" in widget_text(view.line)
        assert host_line(source.snap, 200).plain == (
            "host tier 60 blocks: 30 cached, 10 swapped · total →host 0 ←host 0 · "
            "swap out 0 in 0 · hit device 58% host 0%")
        cats = view.map._cat
        assert (cats == CACHED).sum() == 30 and (cats == USED).sum() == 10
        from roseplay.tui.widgets.step import StepPanel
        step = widget_text(app.query_one(StepPanel))
        assert ("→host 4" in step or "→h 4" in step) and ("←host 2" in step or "←h 2" in step)
        source.snap = base               # no host tier: the view goes
        app.refresh_panels()
        await pilot.pause()
        assert not view.display


@sync
async def test_the_event_log_names_swaps_and_reloads_and_leaves_offloads_to_the_host_line():
    from engine.codes import EV_OFFLOAD, EV_RELOAD, EV_SWAP_FALLBACK, EV_SWAP_OUT
    from engine.snapshot import EngineEvent
    from roseplay.tui.widgets.events import EventLog
    from roseplay.tui.widgets.kv_map import HIT, PREEMPTED, KVMap
    base = with_host_tier(session_snapshot(12))
    t, s = base.time, base.step - 1
    events = (EngineEvent(s, t, EV_OFFLOAD, None, (50, 51), "2 evicted blocks copied"),
              EngineEvent(s, t, EV_SWAP_OUT, "w0-31", (7, 8), "2 blocks copied to the host"),
              EngineEvent(s, t, EV_SWAP_FALLBACK, "w0-30", (9,), "swap: recompute instead"),
              EngineEvent(s, t, EV_RELOAD, "w0-28", (40, 41), "32 prompt tokens from the host"))
    app = RoseplayApp(source=StaticSource(dataclasses.replace(base, events=events)))
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_panels()
        await pilot.pause()
        log = widget_text(app.query_one(EventLog))
        assert "H reload" in log and "P swap out" in log and "no swap" in log
        assert "offload" not in log
        fl = app.query_one("#kv-map", KVMap)._fl
        assert fl[40] == fl[41] == HIT and fl[7] == fl[8] == PREEMPTED


def test_the_hit_cell_marks_hits_from_the_host_tier():
    from types import SimpleNamespace as R
    from roseplay.tui.widgets.kv_host import hit_cell
    assert hit_cell(R(cached_tokens=0, host_cached_tokens=0))[0] == "-"
    assert hit_cell(R(cached_tokens=48, host_cached_tokens=0))[0] == "48"
    assert hit_cell(R(cached_tokens=48, host_cached_tokens=32))[0] == "48h"


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_the_host_tier_line_is_on_screen_at_every_size(size):
    """At 80x24 the KV panel has rows for the map's least and the legend only: the host
    view fell below it, and `--kv-offloading-size` showed nothing of its tier. The line
    now takes a row from the map (its map where the panel has room for it)."""
    from roseplay.tui.widgets.kv_panel import KVPanel
    app = RoseplayApp(source=StaticSource(with_host_tier(session_snapshot(12))))
    async with app.run_test(size=size) as pilot:
        for _ in range(3):          # shown, laid out, then drawn at its width
            app.refresh_panels()
            await pilot.pause()
        panel, line = app.query_one(KVPanel), app.query_one(HostTierView).line
        shown = panel.content_region.intersection(line.region)
        assert shown.height == 1 and shown.width == line.region.width, (shown, line.region)
        text = screen_text(app)
        assert "30 cached, 10 swapped" in text or "30c 10s" in text, text
        assert "in use" in screen_text(app)            # the legend stays


@pytest.mark.parametrize("tier", [False, True])
@sync
async def test_swap_without_a_host_tier_says_it_recomputes(tier):
    """`h` to swap on an engine without a host tier showed only the knob's help: that
    every swap preemption recomputes there (KVCacheManager.swap_out has nowhere to copy
    to) was in the event log alone. The knob's row and the message line say it."""
    from roseplay.tui.widgets.knobs import KnobsPanel, NO_TIER_SWAP
    from tests.roseplay.tui.helpers import live_source, notices, wait_for
    src = live_source(engine=dict(kv_offloading_size=0.01) if tier else {})
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("h")
            assert await wait_for(pilot, lambda: src.snapshot().knobs.preemption_mode == "swap")
            app.refresh_panels()
            await pilot.pause()
            knobs = widget_text(app.query_one(KnobsPanel))
            assert ("swap recomputes: no host tier" in knobs) != tier, knobs
            assert (NO_TIER_SWAP in notices(app)) != tier, notices(app)
            await pilot.press("h")                  # back to recompute: its own help
            assert await wait_for(pilot, lambda: "swap recomputes" not in
                                  widget_text(app.query_one(KnobsPanel)))
    finally:
        src.close()


@sync
async def test_a_swap_waiting_for_the_next_step_keeps_its_note():
    """Paused, `h` to swap: the row says `(from next step)` until the engine applies it,
    then that swap recomputes here."""
    import dataclasses as dc

    from textual.app import App

    from engine.scheduler_config import SchedulerConfig
    from roseplay.tui.widgets.knobs import KnobsPanel

    class Panel(App):
        def compose(self):
            yield KnobsPanel()

    swap, old = SchedulerConfig(preemption_mode="swap"), SchedulerConfig()
    workload = {"scenario": "mixed", "concurrency": 32, "rate": None, "in_flight": 0}
    app = Panel()
    async with app.run_test(size=(200, 30)) as pilot:
        panel = app.query_one(KnobsPanel)
        row = lambda: next(line for line in widget_text(panel).splitlines()   # noqa: E731
                           if "preemption_mode" in line)
        panel.show(swap, old, workload, host_tier=False)
        await pilot.pause()
        assert "(from next step)" in row() and "recomputes" not in row(), row()
        panel.show(swap, dc.replace(old, preemption_mode="swap"), workload, host_tier=False)
        await pilot.pause()
        assert "recomputes: no host tier" in row(), row()
        panel.show(swap, swap, workload, host_tier=True)
        await pilot.pause()
        assert "recomputes" not in row(), row()


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
@sync
async def test_the_host_line_reads_the_engines_totals(size):
    """A live engine with a host tier, swap preemption: the host line's copies each way,
    swaps and host-tier hit rate are the engine's counters in the frame drawn, and the
    device and host hit rates add up to the legend's total hit. It showed the last step's
    copies (`→ 0 ← 0` on most steps) and no swap or per-tier hit figure."""
    import re

    from engine.metrics import prefix_hit_rate
    from tests.roseplay.tui.helpers import live_source, settle, wait_for
    src = live_source(engine=dict(kv_offloading_size=0.01, num_blocks=48,
                                  preemption_mode="swap"), scenario="multi-turn", concurrency=8)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=size) as pilot:
            c = lambda: src.snapshot().counters      # noqa: E731
            assert await wait_for(pilot, lambda: c().swap_outs and c().host_prefix_hit_tokens
                                  and c().kv_reload_blocks, timeout=60)
            await pilot.press("space")
            await settle(pilot, src)
            assert await wait_for(pilot, lambda: app.snapshot.step == src.snapshot().step)
            app.refresh_panels()
            await pilot.pause()
            drawn = app.snapshot.counters
            line = widget_text(app.query_one(HostTierView).line)
            nums = re.search(r"→(?:host )?(\d+) ←(?:host )?(\d+)", line)
            assert nums and (int(nums[1]), int(nums[2])) == (drawn.kv_offload_blocks,
                                                             drawn.kv_reload_blocks), line
            host = prefix_hit_rate(drawn.host_prefix_hit_tokens, drawn.prefix_queried_tokens)
            assert re.search(rf"(hit|host) {100 * host:.0f}%", line), line
            if "swap" in line:
                assert f"{drawn.swap_outs}" in line.split("swap", 1)[1], line
            long = host_line(app.snapshot, 200, app.window).plain
            dev = re.search(r"hit device (\d+)% host (\d+)%", long)
            both = prefix_hit_rate(drawn.prefix_hit_tokens, drawn.prefix_queried_tokens)
            assert abs(int(dev[1]) + int(dev[2]) - 100 * both) <= 1, long
            assert f"swap out {drawn.swap_outs} in {drawn.swap_ins}" in long, long
    finally:
        src.close()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@sync
async def test_large_totals_fit_the_legend_and_the_host_line_whole(size):
    """A long run at 80x24 (thousands evicted, preempted, copied): the totals line read
    `all hit 52% ev4.2k pre1.4k C1…` and the host line `host 37c 18s →3160 ←3252 hit …`.
    Each takes a shorter whole form."""
    from roseplay.tui.widgets.kv_panel import KVLegend
    base = with_host_tier(session_snapshot(12))
    counters = dataclasses.replace(base.counters, evictions=4200, preemptions=1400,
                                   cow_copies=1234, kv_offload_blocks=3160,
                                   kv_reload_blocks=3252, host_prefix_hit_tokens=100)
    app = RoseplayApp(source=StaticSource(dataclasses.replace(base, counters=counters)))
    async with app.run_test(size=size) as pilot:
        for _ in range(2):
            app.refresh_panels()
            await pilot.pause()
        legend = widget_text(app.query_one(KVLegend))
        line = widget_text(app.query_one(HostTierView).line)
        assert "…" not in legend and "…" not in line, (legend, line)
        assert "1.2k" in legend or "1234" in legend, legend
        assert re.search(r"hit \d+%", line), line

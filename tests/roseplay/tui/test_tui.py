"""Pilot tests of the live app: keys reach the engine AND show on screen (dummy:tiny, CPU)."""
from __future__ import annotations

import re

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.workload.own_prompts import own_request_id
from roseplay.tui.widgets.knobs import KnobsPanel
from roseplay.tui.widgets.kv_map import KVMap
from roseplay.tui.widgets.kv_panel import KVLegend
from roseplay.tui.widgets.prompt_input import PromptBar
from roseplay.tui.widgets.request_detail import RequestDetail
from roseplay.tui.widgets.requests import RequestList
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.step import StepPanel
from tests.roseplay.tui.helpers import (SIZE, live_source, notices, palette_query, screen_text,
                                        settle, sync, wait_for, widget_text)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fast_pilot")]


async def _running(pilot, source, n: int = 1) -> None:
    assert await wait_for(pilot, lambda: source.snapshot().counters.finished >= n), \
        "the engine finished no request"


async def _paused_while_running(pilot, source) -> None:
    """Serving, then paused with the space key, with the paused snapshot published."""
    await _running(pilot, source)
    await pilot.press("space")
    await settle(pilot, source)


@sync
async def test_app_serves_at_once_and_panels_render(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _running(pilot, source, 4)
        # the list shows what the app's next pull of the snapshot brings (later when loaded)
        assert await wait_for(pilot, lambda: "finished" in widget_text(app.query_one(RequestList)))
        assert "SERVING" in widget_text(app.query_one(StatusBar))
        assert "dummy:tiny" in widget_text(app.query_one(StatusBar))
        legend = widget_text(app.query_one(KVLegend))
        assert "free" in legend and "cached" in legend and "/96" in legend
        kv = app.query_one(KVMap)
        assert kv.mode == "roomy" and kv.cols > 10
        assert "step" in widget_text(app.query_one(StepPanel))


@sync
async def test_prefix_toggle_reaches_engine_and_knobs_panel(paused_source):
    source = paused_source      # (a knob is applied between steps, paused too)
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        assert source.loop.engine.knobs.enable_prefix_caching is True
        assert await wait_for(pilot, lambda: re.search(r"ON +enable_prefix_caching",
                                                     widget_text(app.query_one(KnobsPanel))), 3)
        await pilot.press("c")
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.enable_prefix_caching is False)
        assert await wait_for(pilot, lambda: re.search(r"OFF +enable_prefix_caching",
                                                     widget_text(app.query_one(KnobsPanel))), 3)
        assert "Reuse KV blocks" in widget_text(app.query_one(KnobsPanel))   # help from config
        await pilot.press("c")
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.enable_prefix_caching is True)


@sync
async def test_policy_keys_cycle_choice_knobs_in_engine_and_panel(paused_source):
    """m / p / e cycle the choice-valued knobs through their `choices` (engine/config.py);
    the panel shows each value and the knob's help, M / P go back; then the engine
    serves on (paused while the keys turn them: a knob is applied between steps)."""
    source = paused_source
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        panel = lambda: widget_text(app.query_one(KnobsPanel))
        assert re.search(r"budget +scheduling_mode", panel())
        steps = (("m", "scheduling_mode", "prefill-first"), ("m", "scheduling_mode", "mixed-chunk"),
                 ("M", "scheduling_mode", "prefill-first"), ("p", "scheduling_policy", "priority"),
                 ("p", "scheduling_policy", "lpm"), ("p", "scheduling_policy", "fcfs"),
                 ("P", "scheduling_policy", "lpm"), ("e", "eviction_policy", "lfu"))
        for key, name, value in steps:
            await pilot.press(key)
            assert await wait_for(pilot, lambda: getattr(source.loop.engine.knobs, name) == value)
            assert await wait_for(pilot, lambda: re.search(rf"{value} +{name}", panel()), 30)
        assert "Which cached prefix block" in panel()          # the eviction knob's help
        before = source.snapshot().counters.finished
        source.resume()
        assert await wait_for(pilot, lambda: source.snapshot().counters.finished > before + 2)


@sync
async def test_budget_and_max_seqs_keys_reach_engine(paused_source):
    source = paused_source      # (a knob is applied between steps, paused too)
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        assert source.loop.engine.knobs.max_num_batched_tokens == 512
        await pilot.press("plus")              # doubles
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.max_num_batched_tokens == 1024)
        await pilot.press("plus", "plus")      # capped at the pool: 96 blocks x 16 tokens
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.max_num_batched_tokens == 1536)
        assert await wait_for(pilot, lambda: "at its cap: 1536 tokens" in notices(app), 30)
        await pilot.press("minus", "minus", "minus")
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.max_num_batched_tokens == 192)
        assert await wait_for(pilot, lambda: "192 tok/step" in widget_text(app.query_one(KnobsPanel)), 30)
        await pilot.press("left_square_bracket")
        assert await wait_for(pilot, lambda: source.loop.engine.knobs.max_num_seqs == 56)


@sync
async def test_a_budget_below_the_running_requests_warns(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        def in_step() -> int:
            return sum(r.state in ("decoding", "prefilling", "dedup")
                       for r in source.snapshot().requests)
        await _running(pilot, source)
        for _ in range(5):      # 4 in flight; a pause may fall while some sit between
            assert await wait_for(pilot, lambda: in_step() >= 3)     # finishing and successor
            await pilot.press("space")
            await settle(pilot, source)
            if (running := in_step()) >= 3:
                break
            await pilot.press("space")
        assert running >= 3
        source.set_knobs(max_num_batched_tokens=4)
        await pilot.press("minus")
        assert source.loop.knobs.max_num_batched_tokens == 2
        assert await wait_for(
            pilot, lambda: f"budget 2 < {running} running requests" in notices(app), 3)


@sync
async def test_small_budget_halves_and_chunks_prefill():
    src = live_source(engine=dict(max_num_batched_tokens=64), input_len=96, concurrency=2)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("minus", "minus")      # 64 -> 32 -> 16: below the step, halve
            assert await wait_for(pilot, lambda: src.loop.engine.knobs.max_num_batched_tokens == 16)
            await pilot.press("c")                   # no prefix hits: every prompt is chunked
            assert await wait_for(pilot, lambda: any(
                r.state == "prefilling" and r.chunks_done >= 1 for r in src.snapshot().requests))
            assert await wait_for(pilot, lambda: "chunk " in widget_text(app.query_one(RequestList)), 30)
    finally:
        src.close()


@sync
async def test_pause_stops_steps_and_resume_restarts(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _paused_while_running(pilot, source)
        step = source.loop.engine.stats.counters.steps
        await pilot.pause(1.0)
        assert source.loop.engine.stats.counters.steps == step
        assert "PAUSED" in widget_text(app.query_one(StatusBar))
        assert f"step {step}" in widget_text(app.query_one(StatusBar))
        await pilot.press("space")
        assert await wait_for(pilot, lambda: source.loop.engine.stats.counters.steps > step + 2)
        assert "SERVING" in widget_text(app.query_one(StatusBar))


@sync
async def test_single_step_advances_exactly_one_step(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _paused_while_running(pilot, source)
        assert source.loop.engine.has_unfinished()
        for _ in range(3):
            step = source.loop.engine.stats.counters.steps
            await pilot.press("n")
            assert await wait_for(pilot, lambda: source.snapshot().step == step + 1)
            await pilot.pause(0.3)
            assert source.loop.engine.stats.counters.steps == step + 1
            assert await wait_for(pilot, lambda: f"step {step + 1}"
                                  in widget_text(app.query_one(StatusBar)), 3)


@sync
async def test_submitted_prompt_appears_and_finishes(paused_source):
    source = paused_source      # (typing needs no step; the engine serves the prompt)
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i")
        assert app.query_one(PromptBar).has_class("-open")
        assert await wait_for(pilot, lambda: app.focused is app.query_one("#prompt-input"), 30)
        await pilot.press(*"to be or not to be")
        source.resume()
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: (r := source.snapshot().request(own_request_id(1))) is not None
                              and r.state == "finished")
        assert f"submitted as {own_request_id(1)}" in widget_text(app.query_one("#prompt-status"))
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: "you…-1" in widget_text(app.query_one(RequestList)), 30)
        detail = widget_text(app.query_one(RequestDetail))
        assert own_request_id(1) in detail and "to be or not to be" in detail


@sync
async def test_invalid_prompt_shows_error_and_engine_keeps_serving(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _running(pilot, source)
        await pilot.press("i")
        assert await wait_for(pilot, lambda: app.focused is app.query_one("#prompt-input"), 30)
        app.query_one("#prompt-input").value = "x" * 2000      # > 96 blocks x 16 tokens
        await pilot.press("enter")
        status = app.query_one("#prompt-status")
        assert await wait_for(pilot, lambda: "✗" in widget_text(status), 30)
        assert "can never fit the KV pool" in widget_text(status)
        finished = source.snapshot().counters.finished
        assert await wait_for(pilot, lambda: source.snapshot().counters.finished > finished + 2)


@sync
async def test_scenario_concurrency_and_rate_keys(paused_source):
    source = paused_source      # (the driver's settings: the engine serves them at the end)
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        assert source.driver.scenario_name == "long-short"
        assert await wait_for(pilot, lambda: "long-short" in widget_text(app.query_one(KnobsPanel)), 30)
        await pilot.press("s", "s")
        assert source.driver.scenario_name == "random"
        await pilot.press("S")
        assert source.driver.scenario_name == "identical"
        await pilot.press("s")
        await pilot.press("greater_than_sign")
        assert source.driver.concurrency == 8
        await pilot.press("r")
        assert source.driver.request_rate == 1.0
        assert await wait_for(pilot, lambda: "1/s" in widget_text(app.query_one(KnobsPanel)), 30)
        await pilot.press("R", "R")             # r cycles back too: 1/s -> ∞ -> 50/s
        assert source.driver.request_rate == 50.0
        source.resume()
        await _running(pilot, source, 2)


@sync
async def test_clear_prefix_cache_frees_cached_blocks(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _running(pilot, source, 4)
        await pilot.press("space")
        await settle(pilot, source)
        assert source.snapshot().num_cached > 0
        await pilot.press("x", "n")     # applied before the next step
        assert await wait_for(pilot, lambda: source.snapshot().num_cached == 0)


@sync
async def test_help_screen_opens_and_closes(paused_source):
    app = RoseplayApp(source=paused_source)     # (no step needed: the engine stays paused)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")      # a loaded machine may take a few frames
        assert await wait_for(pilot, lambda: type(app.screen).__name__ == "HelpScreen", 30)
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: type(app.screen).__name__ != "HelpScreen", 30)


@sync
async def test_select_request_highlights_its_blocks(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _paused_while_running(pilot, source)
        live = ("prefilling", "decoding")
        for _ in range(4):      # paused between a finish and the next admission: step once
            if any(r.state in live for r in source.snapshot().requests):
                break
            await pilot.press("n")
            await settle(pilot, source)
        await pilot.pause(0.2)
        await pilot.press("down", "up")
        lst = app.query_one(RequestList)
        # walk down to a live request (finished ones hold no blocks and are not highlighted)
        for _ in range(len(lst.rows)):
            if lst.current.state in live:
                break
            await pilot.press("down")
        chosen = lst.current
        assert chosen.state in live and chosen.blocks
        assert lst.selected == chosen.request_id
        from roseplay.tui.widgets.kv_map import SELECTED
        kv = app.query_one(KVMap)
        highlighted = lambda: set(map(int, (kv._cat == SELECTED).nonzero()[0]))  # noqa: E731
        # a flash (C/P/H) marks a cell without taking its category: the whole selection shows
        assert await wait_for(pilot, lambda: highlighted() == set(chosen.blocks), timeout=5)
        assert chosen.request_id in widget_text(app.query_one(KVLegend))


@sync
async def test_hovering_a_block_describes_it(source):
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _paused_while_running(pilot, source)
        await pilot.hover(KVMap, offset=(0, 0))
        assert app.query_one(KVMap).hover_block == 0
        assert await wait_for(pilot, lambda: "block 0:" in widget_text(app.query_one(KVLegend)), 30)


@sync
async def test_typing_a_knob_value_in_the_command_palette(paused_source):
    source = paused_source      # (the palette sets knobs without a step: the engine stays
    app = RoseplayApp(source=source)     # paused; the keys' tests above run it)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p", *"max_num_seqs 32")
        assert await wait_for(pilot, lambda: "set max_num_seqs = 32" in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: source.loop.knobs.max_num_seqs == 32, 30)
        await palette_query(pilot, app, "budget 0")     # (typed at once: the keys above)
        assert await wait_for(pilot, lambda: "set max_num_batched_tokens = 0" in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: "must be >= 1" in notices(app), 30)
        assert source.loop.knobs.max_num_batched_tokens == 512


@sync
async def test_a_key_at_a_knobs_limit_changes_nothing_and_marks_nothing(paused_source):
    """D at k = 0 (speculation off) sets nothing: no mark on the plots, no restart of the
    10 s figures; it says so. d then raises k and marks it."""
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=SIZE) as pilot:
        assert paused_source.knobs.num_speculative_tokens == 0
        await pilot.press("D")
        assert await wait_for(pilot, lambda: "num_speculative_tokens is already 0" in notices(app), 30)
        await pilot.pause()
        history = app.timing.history
        assert not history._pending and not any(history.marks)
        await pilot.press("d")
        assert await wait_for(pilot, lambda: paused_source.knobs.num_speculative_tokens == 1, 30)
        assert list(history._pending) == ["spec k 1"] or "spec k 1" in history.marks


def _tpots(snap, since: float) -> list[float]:
    return [tpot for t, _, tpot in snap.recent_latencies if t >= since and tpot is not None]


@sync
async def test_latency_after_pause_and_resume_leaves_the_pause_out(source):
    """The requests in flight across a pause (and a few single steps) are not charged
    the pause: their decode time (TPOT x their gaps) stays under half of it. The pause
    lasts at least 2 s and 20x what one of those requests took to decode unpaused
    (p99 TPOT x its tokens), so a pause counted as serving time fails by far, and a
    step 10x slower after resuming (a loaded 2-core box; the first token after
    resuming waits for two forwards under async scheduling) still passes."""
    import time

    import numpy as np
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        await _running(pilot, source, 8)
        t0 = source.snapshot().time         # 8 requests at least (a loaded box: later)
        assert await wait_for(pilot, lambda: len(_tpots(source.snapshot(), t0)) >= 8, 60)
        unpaused = float(np.percentile(_tpots(source.snapshot(), t0), 99))
        decoding = lambda: any(r.state == "decoding" for r in source.snapshot().requests)  # noqa: E731
        for _ in range(20):    # pausing right as a wave of requests ends leaves none
            assert await wait_for(pilot, decoding, 60)    # decoding: go on, again
            await pilot.press("space")
            paused_at = time.perf_counter()
            await settle(pilot, source)
            spanning = {r.request_id: r.max_tokens for r in source.snapshot().requests
                        if r.state == "decoding"}
            if spanning:
                break
            await pilot.press("space")
            await pilot.pause(0.2)
        assert spanning
        pause = max(2.0, 20 * unpaused * max(spanning.values()))
        await pilot.pause(pause / 2)
        await pilot.press("n", "n", "n")
        await pilot.pause(pause / 2)
        await pilot.press("space")
        paused_for = time.perf_counter() - paused_at
        finished = {}     # each view as first seen finished: the snapshot keeps only the
        #                   RECENT_FINISHED latest, which a loaded box's late poll can miss

        def ended() -> bool:
            snap = source.snapshot()
            for rid in spanning:
                r = snap.request(rid)
                if r is not None and r.state == "finished":
                    finished.setdefault(rid, r)
            return all(rid in finished or snap.request(rid) is None for rid in spanning)
        assert await wait_for(pilot, ended)
        decode = [r.tpot * max(1, r.output_tokens - 1) for r in finished.values()
                  if r.tpot is not None]
        assert decode and max(decode) < paused_for / 2, (decode, paused_for, unpaused)

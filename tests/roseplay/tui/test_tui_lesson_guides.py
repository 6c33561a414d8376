"""Issue 22: what a guide does to the screen, on a live dummy engine with the app's pool
(512 blocks): messages on the message line (never a toast over the plots), a stale hit
rate with the cache off, stats that carry over into the next guide, the scorecard, the
Knobs panel describing another scenario, `chunk k/n` below the fold."""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from engine.codes import RUNNING_STATES
from roseplay.tui.app import RoseplayApp
from roseplay.tui.guides.catalog import BY_KEY
from roseplay.tui.widgets.knobs import KnobsPanel
from roseplay.tui.widgets.kv_panel import KVLegend
from roseplay.tui.widgets.requests import RequestList
from tests.roseplay.tui.helpers import (live_source, screen_text, settle, sync, wait_for,
                                        widget_text)

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("fast_pilot")]


@pytest.fixture
def source():
    src = live_source(scenario="mixed", concurrency=32, engine=dict(num_blocks=512,
                                                                    max_num_seqs=16))
    yield src
    src.close()


def _published(source, app) -> dict:
    """Where the engine's snapshots and the app's frame stand (a failure's context)."""
    src, shown = source.snapshot(), app.snapshot
    return {"engine step": src.step, "engine time": src.time,
            "engine caching": src.knobs.enable_prefix_caching, "error": src.error,
            "shown step": shown.step if shown else None,
            "shown time": shown.time if shown else None}


def _legend(app) -> list[str]:
    return widget_text(app.query_one(KVLegend)).splitlines()


def _message_line(app) -> str:
    return screen_text(app).splitlines()[-2]


def _running_shown(app) -> int:
    """Running requests in the snapshot the app shows (what its budget warning counts)."""
    return sum(r.state in RUNNING_STATES for r in (app.snapshot.requests if app.snapshot
                                                   else ()))


async def _guide(pilot, app, key: str) -> None:
    await pilot.press("question_mark")
    assert await wait_for(pilot, lambda: "Knob guidance" in screen_text(app), 30)
    await pilot.press(key)
    assert await wait_for(pilot, lambda: f"Guide {key}" in widget_text(app.knobs), 30)


@sync
async def test_messages_are_on_the_message_line_never_over_a_panel(source, monkeypatch):
    """Budget warnings used to stack as toasts over Timing; they go to the message line.
    Paused, so the running count the warning compares with holds, and with the message
    line's clock held still: a warning lasts 5 s there, which a loaded box's key presses
    and polls could outlast before the line is read."""
    import roseplay.tui.app as app_module
    monkeypatch.setattr(app_module, "time", SimpleNamespace(
        monotonic=lambda: 1000.0, thread_time=time.thread_time))
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        # the warning counts the running requests of the snapshot on screen: paused with
        # 8 or more running there (the app pulls the paused snapshot), that count holds
        # while the keys are pressed, however slowly a loaded box presses them
        for _ in range(5):
            assert await wait_for(pilot, lambda: _running_shown(app) >= 8, 30)
            await pilot.press("space")
            await settle(pilot, source)
            if await wait_for(pilot, lambda: app.snapshot.step == source.snapshot().step, 30) \
                    and _running_shown(app) >= 8:
                break
            await pilot.press("space")
        assert _running_shown(app) >= 8 and app.snapshot.paused
        for _ in range(7):                           # 512 -> 4: below the running requests
            await pilot.press("minus")
        assert await wait_for(pilot, lambda: "running requests" in _message_line(app), 30), \
            _message_line(app)
        assert not list(app.screen.query("Toast")) and not list(app.screen.query("ToastRack"))
        assert "TTFT" in widget_text(app.timing.stats)    # nothing drawn over the panel


@sync
async def test_the_cache_off_reads_off_not_the_last_10_s_of_hits(source):
    """With the cache off the legend's 10 s hit rate read 62-87 % for ~8 s."""
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: re.search(r"hit +[1-9]\d*%", _legend(app)[2]),
                              60), _legend(app)
        await pilot.press("c")
        assert await wait_for(pilot, lambda: "hit off" in _legend(app)[2], 30), \
            (_legend(app), _published(source, app))
        # the 10 s window starts again at the change: it says how many seconds it covers
        assert re.match(r"\s*[0-3] s ", _legend(app)[2]), _legend(app)


@sync
async def test_a_guide_starts_its_stats_clean_and_says_when(source):
    """Guide 4 (no preemption) showed guide 3's preemptions and its peak of 512."""
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _guide(pilot, app, "3")
        assert await wait_for(pilot, lambda: re.search(r"pre(empted)? [1-9]", _legend(app)[3]),
                              90), _legend(app)
        peak_before = source.snapshot().peak_used_blocks
        await _guide(pilot, app, "4")
        assert await wait_for(pilot, lambda: "clean since step" in widget_text(app.knobs),
                              90), widget_text(app.knobs)
        await pilot.pause(0.5)
        totals = _legend(app)[3]
        assert totals.lstrip("│ ").startswith("reset") and re.search(r"pre(empted)? 0 ",
                                                                         totals), totals
        peak = int(re.search(r"peak (\d+)", _legend(app)[1]).group(1))
        assert peak < peak_before and peak == app.window.peak_used(app.snapshot)
        clean = app.knobs.guide_run.side.window.first
        assert app.window.reset_time is not None and app.window.reset_time >= clean.time


@sync
async def test_the_scorecard_shows_each_claim_measured_with_the_tests_check(source):
    """Guide 6 (cache off) against guide 5, the other side measured by the one key the
    card names (`c`): each verdict is guide_check.verdicts', the tests' check."""
    from roseplay.tui.guides.check import verdicts
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _guide(pilot, app, "6")
        card = lambda: widget_text(app.knobs)                       # noqa: E731
        assert "for the comparison: c (enable_prefix_caching on)" in card().replace(
            "│", " ").replace("\n", " ").replace("  ", " ") or "for the comparison" in card()
        assert await wait_for(pilot, lambda: "✓ prefix hit rate 0% = 0" in card(), 120), card()
        await pilot.press("c")                                       # guide 5's setup
        assert await wait_for(pilot, lambda: "measuring guide 5" in card(), 30), card()
        assert await wait_for(pilot, lambda: "5" in app.guide_results, 120), card()
        await pilot.pause(0.5)
        results, guide = app.guide_results, BY_KEY["6"]
        for name, direction, ok in verdicts(guide.expect, results["6"], results["5"]):
            row = next(line for line in card().splitlines()
                       if {"hit_rate": "prefix hit rate", "kv_used": "KV used"}[name] in line)
            assert ("✓" if ok else "✗") in row, (name, direction, row, results)


@sync
async def test_the_knobs_panel_describes_the_running_scenario(source):
    """After `?3` the Knobs panel still described "mixed" (a list of every scenario cut
    mid-sentence)."""
    source.pause()              # (the panel describes the workload: no step needed)
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("s")                       # mixed -> shared-prefix
        assert await wait_for(pilot, lambda: "scenario shared-prefix (Shared system "
                              "prompts)" in screen_text(app), 5), _message_line(app)
        assert "mixed: Chat" not in screen_text(app)
        await _guide(pilot, app, "3")
        text = widget_text(app.query_one(KnobsPanel))
        assert "guide 3: random" in text and "mixed" not in text, text


@sync
async def test_guide_1_puts_chunk_k_of_n_in_view_at_80x24(monkeypatch):
    """Guide 1's "chunk k/n" sat below the fold of a list sorted by arrival."""
    src = live_source(scenario="mixed", concurrency=32, input_len=64, output_len=64,
                      engine=dict(num_blocks=512, max_num_seqs=16))
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(80, 24)) as pilot:
            app.pick_guide("1")
            # (the progress bar may stand between the state and k/n: `prefilling ▋ 3/10`)
            seen = lambda: re.search(r"prefilling [ ▏▎▍▌▋▊▉█]*(chunk )?\d+/\d+",  # noqa: E731
                                     widget_text(app.query_one(RequestList))) and \
                "sorted by state" in widget_text(app.query_one(RequestList))
            assert await wait_for(pilot, seen, 60), widget_text(app.query_one(RequestList))
    finally:
        src.close()


def test_the_scorecards_legend_is_never_cut():
    """At 120x40 the Knobs panel is 50 columns: the legend read "(✓ holds, ✗ does not,
    … not" (its first wrapped line only); it now takes a form that fits whole."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.guide_card import LEGENDS, card_text
    run = SimpleNamespace(guide=BY_KEY["3"], status=lambda: "window clean", rows=lambda: [],
                          versus_hint=lambda hint: "")
    for width, legend in ((len(LEGENDS[0]), LEGENDS[0]), (50, LEGENDS[1])):
        lines = card_text(run, width, 20).plain.splitlines()
        assert legend in lines, (width, lines)


def test_a_narrow_scorecard_names_the_guides_own_knob():
    """At 80x24 the card is 30 columns: guide 9's head read "guide 9: mixed · queue",
    its `priority` wrapped off unsaid. The knobs now come first, and a line that leaves
    words out ends with "…"."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.guide_card import card_text
    for key, knob in (("9", "queue priority"), ("6", "prefix cache OFF"), ("1", "budget 32")):
        run = SimpleNamespace(guide=BY_KEY[key], status=lambda: "window clean",
                              rows=lambda: [("TTFT p50 306 ms < the default's -", None)],
                              versus_hint=lambda hint: "")
        lines = card_text(run, 30, 11).plain.splitlines()
        assert knob in lines[0], lines
        assert any("TTFT p50" in line for line in lines), lines
        assert any(line.startswith("watch:") for line in lines), lines
        assert lines[1].endswith("…") or "in flight" in " ".join(lines[:2]), lines


@pytest.mark.parametrize("width", [30, 50])
def test_a_guide_on_default_knobs_says_so_in_its_scorecard(width):
    """Guides 7 and 8 set no knob: the head read "guide 7: random ·  · 2 in flight"."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.guide_card import card_text
    for key in ("7", "8"):
        run = SimpleNamespace(guide=BY_KEY[key], status=lambda: "window clean",
                              rows=lambda: [], versus_hint=lambda hint: "")
        head = " ".join(card_text(run, width, 11).plain.splitlines()[:2])
        assert "default knobs" in head and "·  ·" not in head and ":  ·" not in head, head

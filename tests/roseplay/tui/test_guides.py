"""Knob guidance on the help screen (one key per claim switches the engine to its setup),
knobs' `explain` paragraphs rendered generically, and the live goodput SLOs (key l)."""
from __future__ import annotations

import dataclasses

import pytest

from engine.config import SchedulerConfig
from roseplay.tui.app import RoseplayApp
from roseplay.tui.defaults import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS
from roseplay.tui.guides.catalog import BY_KEY, GUIDES, split_knobs
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets import help as help_mod
from roseplay.tui.widgets.timing import goodput_share, view_latencies
from tests.roseplay.tui.helpers import SESSION, fast_idle, live_source, notices, screen_text, session_snapshot, \
    sync, wait_for

pytestmark = pytest.mark.timeout(120)


def test_every_guide_names_a_scenario_and_real_knob_values():
    from roseplay.workload.scenarios import SCENARIOS
    assert [g.key for g in GUIDES] == list("1234567890d")[:len(GUIDES)]    # digits, then d
    for g in GUIDES:
        assert g.scenario in SCENARIOS and g.claim and g.source and g.watch
        usable, skipped = split_knobs(g)
        SchedulerConfig().replace(**usable)        # the values a guide sets are valid
        assert set(usable) | set(skipped) == set(g.knobs)
    assert "max_num_batched_tokens" in split_knobs(BY_KEY["1"], "max_num_batched_tokens")[1]
    assert {g.scenario for g in GUIDES} >= {"mixed", "random"}


def test_help_renders_every_live_knob_with_its_explain_paragraph(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Policy:
        eviction_policy: str = dataclasses.field(default="lru", metadata={
            "help": "Which cached block goes first.", "live": True, "choices": ("lru", "lfu"),
            "explain": "LRU evicts the block unused for longest; LFU the least reused."})
    fields = help_mod.live_fields() + list(dataclasses.fields(Policy))
    monkeypatch.setattr(help_mod, "live_fields", lambda: fields)
    text = help_mod.knobs_markdown()
    assert "**eviction_policy** (lru / lfu): Which cached block goes first." in text
    assert "LRU evicts the block unused for longest; LFU the least reused." in text
    for f in SchedulerConfig.__dataclass_fields__.values():
        assert f"**{f.name}**" in text


def test_guidance_table_cites_both_guides_and_marks_missing_knobs():
    text = help_mod.guides_text("live").plain
    assert "vLLM Optimization and Tuning" in text and "SGLang Hyperparameter Tuning" in text
    for g in GUIDES:
        assert f" {g.key}  {g.claim} " in text
    missing = [g for g in GUIDES if split_knobs(g)[1]]
    for g in missing:
        assert f"needs the {', '.join(split_knobs(g)[1])} knob" in text
    assert "On a live engine a digit" in help_mod.guides_text("replay").plain


@sync
async def test_one_key_on_the_help_screen_switches_to_a_guide(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(paused=True)      # (a guide's knobs and workload need no step)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        src.set_knobs(max_num_seqs=8, scheduling_policy="lpm")   # left from an earlier setup
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        assert await wait_for(pilot, lambda: "Knob guidance" in screen_text(app), 30)
        await pilot.press("1")                     # a small budget on the mixed workload
        assert await wait_for(pilot, lambda: type(app.screen).__name__ != "HelpScreen", 30)
        assert src.knobs.max_num_batched_tokens == 32
        # the whole setup from a clean default (the app's): the other knobs are back at theirs
        assert src.knobs.max_num_seqs == TUI_MAX_NUM_SEQS
        assert src.knobs.scheduling_policy == SchedulerConfig().scheduling_policy
        assert src.workload()["scenario"] == "mixed"
        assert src.workload()["concurrency"] == TUI_CONCURRENCY
        await pilot.press("question_mark", "6")    # the prefix cache off
        await pilot.pause(0.1)
        assert not src.knobs.enable_prefix_caching and src.knobs.max_num_batched_tokens == 512
        assert "guide 6" in notices(app)
        await pilot.press("question_mark", "0")    # 0 on the help screen: the eviction guide
        await pilot.pause(0.1)
        assert src.knobs.eviction_policy == "lfu" and "guide 0" in notices(app)
        await pilot.press("q")


def test_goodput_share_by_hand():
    snap = session_snapshot(29)
    done = [r for r in snap.requests if r.state == "finished"]
    assert done
    lat = [view_latencies(r) for r in done]
    for (ttft, tpot, e2el), r in zip(lat, done):   # E2EL = TTFT + TPOT x (n - 1)
        assert e2el == pytest.approx(ttft + (tpot or 0) * (r.output_tokens - 1))
    ttfts = sorted(x[0] for x in lat)
    mid = ttfts[len(ttfts) // 2]
    good, total = goodput_share(snap, -1e9, {"ttft": mid * 1000})
    assert total == len(done) and good == sum(t <= mid for t in ttfts)
    assert goodput_share(snap, -1e9, {"ttft": 1e-6})[0] == 0


@sync
async def test_slos_from_the_cli_and_the_l_editor():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True), slos={"ttft": 100.0})
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(29)         # (the frame 29 presses of n reach; no frame between)
        app.refresh_panels()
        await pilot.pause(0.1)
        assert "goodput: ttft≤100 (l edits)" in screen_text(app)
        assert "good " in screen_text(app)
        await pilot.press("l")
        assert type(app.screen).__name__ == "SloScreen"
        await pilot.press(*"ctrl+u".split())
        await pilot.press(*"tpot:x", "enter")           # refused, the editor stays
        assert type(app.screen).__name__ == "SloScreen" and "not a number" in screen_text(app)
        app.screen.query_one("Input").value = "ttft:250 e2el:5000"
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.slos == {"ttft": 250.0, "e2el": 5000.0}
        assert app.timing.slos == app.slos
        app.refresh_panels()
        await pilot.pause(0.1)
        assert "goodput: ttft≤250 e2el≤5000" in screen_text(app)


def test_a_key_a_guide_names_to_turn_back_is_the_one_that_does():
    """Guide 9 said `p back to fcfs`: from priority, p turns to lpm; P goes back. A key a
    guide's watch text names for its other side is the one `turn_hint` finds."""
    import re

    from roseplay.tui.guides.catalog import ROUTING_GUIDES, turn_hint
    named = 0
    for g in (*GUIDES, *ROUTING_GUIDES):
        for key in re.findall(r"(?:^|[;,] |against )(\S)(?: back to| flips it back|: )",
                              g.watch):
            named += 1
            assert turn_hint(g).split()[0] == key, (g.key, g.watch)
    assert named >= 4           # 9, 0, a and b name theirs

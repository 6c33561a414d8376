"""The token choice on screen (issue 33): the speculation knob's keys, speculation's
counts in the panels, the next-token distribution of the selected request."""
from __future__ import annotations

import pytest

from engine.config import MAX_SPECULATIVE_TOKENS
from roseplay.tui.app import RoseplayApp
from roseplay.workload.own_prompts import own_request_id
from roseplay.tui.keys import KEYS, knob_key
from roseplay.tui.widgets.help import keys_markdown, knobs_markdown
from roseplay.tui.widgets.token_choice import (NO_LOGPROBS, NO_LOGPROBS_SHORT, NO_TOKEN_YET,
                                              NO_TOKEN_YET_SHORT, choice_text, pct)
from tests.roseplay.tui.helpers import live_source, widget_text, sync, wait_for

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("fast_pilot")]


def test_every_key_is_bound_once_and_each_knob_key_is_defined_in_keys():
    names = [n for k in KEYS if k.action != "resume" for n in k.keys.split(",")]
    assert len(names) == len(set(names)), "a key is bound twice"
    # but space, twice: pause and resume (the footer shows the one that applies)
    assert {k.keys for k in KEYS if k.action in ("pause", "resume")} == {"space"}
    assert knob_key("num_speculative_tokens") == "D/d"
    assert knob_key("max_num_batched_tokens") == "-/+" and knob_key("max_num_seqs") == "[/]"
    assert knob_key("enable_prefix_caching") == "c" and knob_key("scheduling_mode") == "m"
    assert "`d`" in keys_markdown("live") and "num_speculative_tokens" in keys_markdown("live")
    assert "`D/d` **num_speculative_tokens**" in knobs_markdown()
    assert "`d`" not in keys_markdown("replay")          # a live knob: hidden in a replay


@pytest.mark.slow
@sync
async def test_d_and_D_turn_speculation_on_and_off_on_the_engine_process():
    src = live_source(in_process=False, scenario="identical")
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            knobs = app.query_one("KnobsPanel")
            assert await wait_for(pilot, lambda: "OFF" in widget_text(knobs)
                                  and "D/d" in widget_text(knobs), 10)
            top = MAX_SPECULATIVE_TOKENS    # the engine's limit of k, read by the key
            await pilot.press(*"d" * (top + 2))     # clamped at the top
            assert src.knobs.num_speculative_tokens == top
            assert await wait_for(pilot, lambda: app.snapshot.knobs.num_speculative_tokens
                                  == top, 30), f"the engine never applied k={top}"
            assert await wait_for(pilot, lambda: f"{top} drafts" in widget_text(knobs), 30)
            assert "num_speculative_tokens:" in widget_text(knobs)     # its help text
            await pilot.press(*"D" * (top + 1))  # clamped at 0: off
            assert await wait_for(pilot, lambda: app.snapshot.knobs.num_speculative_tokens
                                  == 0, 30)
            assert src.knobs.num_speculative_tokens == 0
    finally:
        src.close()


@sync
async def test_speculation_shows_in_this_step_the_plots_and_the_kv_map():
    """Greedy `identical` prompts on dummy:tiny repeat themselves, so n-gram drafts are
    accepted: the step panel, the acceptance plots and the counters agree."""
    from roseplay.tui.widgets.events import flash_blocks
    from roseplay.tui.widgets.kv_map import ROLLBACK
    src = live_source(in_process=False, scenario="identical", output_len=48,
                      engine={"num_blocks": 64})
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(200, 60)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            plot = app.query_one("#plot-accept")
            assert not plot.display             # off: no rows of "-" for speculation
            await pilot.press("d", "d", "d")
            step = app.query_one("StepPanel")
            seen = []

            def verified():
                s = app.snapshot.last_step
                if s is not None and s.spec_verified and "drafted" in widget_text(step):
                    seen.append(s)
                return any(s.spec_accepted_tokens for s in seen)
            assert await wait_for(pilot, verified, 60), widget_text(step)
            s = seen[-1]
            assert 0 <= s.spec_accepted_tokens <= s.spec_draft_tokens <= 3 * s.spec_verified
            c = app.snapshot.counters
            assert 0 < c.spec_decode_num_accepted_tokens <= c.spec_decode_num_draft_tokens
            hist = app.timing.history.series
            assert await wait_for(pilot, lambda: any(v > 0 for v in hist["accept"]), 30)
            accept = [v for v in hist["accept"] if v == v]
            lengths = [v for v in hist["alen"] if v == v]
            assert all(0 <= v <= 100 for v in accept) and all(1 <= v <= 4 for v in lengths)
            assert any(v > 1 for v in lengths)
            # the history takes every frame, the panel redraws (and shows the plots) at
            # most every UPDATE_EVERY seconds: on a loaded box that is a later frame
            assert await wait_for(pilot, lambda: plot.display
                                  and app.query_one("#plot-alen").display, 30)
            assert await wait_for(pilot, lambda: "accepted" in widget_text(plot), 30)
            assert any(mark and mark.startswith("spec k") for mark in app.timing.history.marks)
            snap = app.snapshot          # one snapshot: its requests and its counters
            views = [r for r in snap.requests if r.spec_draft_tokens]
            assert views and all(0 <= r.spec_accepted_tokens <= r.spec_draft_tokens
                                 for r in views)
            assert sum(r.spec_draft_tokens for r in views) \
                <= snap.counters.spec_decode_num_draft_tokens
            app.detail.show(views[0], None, "processed_logprobs")   # its own totals
            assert (f"spec {views[0].spec_draft_tokens} drafted → "
                    f"{views[0].spec_accepted_tokens} accepted") in app.detail._text.plain
            rolled = [e for e in app.snapshot.events if e.kind == "spec_verify" and e.blocks]
            if rolled:      # a rollback frees the block a rejected draft filled
                flashes = flash_blocks(app.snapshot)
                assert all(flashes.get(b) in (ROLLBACK, None) for b in rolled[-1].blocks)
    finally:
        src.close()


def test_no_distribution_says_why_before_and_after_the_first_token():
    """Before its first token a request has no distribution whether or not it asked for
    logprobs (a typed prompt waiting in the queue did), so the panel says none is
    sampled yet; after it, one without logprobs says how to get them."""
    from types import SimpleNamespace
    view = SimpleNamespace(logprobs=None, output_tokens=0, spec_draft_tokens=0)
    assert choice_text(view, None, "processed_logprobs", 1).plain == NO_TOKEN_YET
    # a line narrower than the sentence (the Selected panel at 80x24) gets its short form
    assert choice_text(view, None, "processed_logprobs", 1, 42).plain == NO_TOKEN_YET_SHORT
    assert choice_text(view, None, "processed_logprobs", 3, 42).plain == NO_TOKEN_YET
    view.output_tokens = 3
    assert choice_text(view, None, "processed_logprobs", 1).plain == NO_LOGPROBS
    assert choice_text(view, None, "processed_logprobs", 1, 42).plain == NO_LOGPROBS_SHORT


@sync
async def test_a_typed_prompt_shows_its_next_token_distribution():
    """The typed prompt asks for top-5 logprobs and the model's own: the Selected panel
    shows the processed top token with its model p and processed p (the engine's
    numbers; tests/roseplay/tui/test_tui_distribution.py checks every row); a generated
    request without logprobs says how to get them."""
    import math
    from roseplay.workload.driver import TOP_LOGPROBS
    from roseplay.workload.source import LOGPROBS_EVERY
    src = live_source(in_process=False, concurrency=2)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            detail = app.query_one("#detail")
            plain = [r for r in app.snapshot.requests if r.logprobs is None]
            assert await wait_for(pilot, lambda: "type a prompt with i" in widget_text(detail)
                                  or any(r.logprobs for r in app.snapshot.requests), 20)
            await pilot.press("i", *"to be or not", "enter")
            view = lambda: app.snapshot.request(own_request_id(1))           # noqa: E731
            assert await wait_for(pilot, lambda: view() is not None
                                  and view().logprobs is not None, 30)
            lp = view().logprobs
            assert len(lp.token_ids) == TOP_LOGPROBS + 1 and 1 <= lp.rank
            assert lp.logprobs[1:] == sorted(lp.logprobs[1:], reverse=True)
            assert sum(math.exp(v) for v in lp.logprobs[1:]) <= 1.0 + 1e-4
            # a typed prompt asks for the model's top-n too: both, side by side (one line
            # here: the processed top-1 first, its model p -> processed p)
            def top1_shown() -> bool:
                lp = view().logprobs
                raw = dict(zip(lp.raw.token_ids[1:], lp.raw.logprobs[1:]))
                a = pct(math.exp(raw[lp.token_ids[1]])) if lp.token_ids[1] in raw else "–"
                want = f"next token model→after: #{lp.token_ids[1]} {a}→" \
                       f"{pct(math.exp(lp.logprobs[1]))}"
                return want in widget_text(detail)
            assert await wait_for(pilot, top1_shown, 30), widget_text(detail)
            # the generated workload: 1 in LOGPROBS_EVERY requests asks for them
            asked = [r for r in app.snapshot.requests
                     if r.request_id.startswith("w") and r.logprobs is not None]
            ids = {int(r.request_id.rsplit("-", 1)[1]) for r in asked}
            assert all(i % LOGPROBS_EVERY == 0 for i in ids), ids
            assert plain or ids
    finally:
        src.close()

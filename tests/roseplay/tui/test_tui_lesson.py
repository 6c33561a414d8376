"""What a teacher reads off the app, checked against the engine's own numbers: the step
strip (Steps: composition, budget, chunks per prompt), the TTFT split (Selected request,
Timing), the token scrub (`w`: a typed prompt's distributions token by token), and
speculative decoding's method, k and bursty ITL. Live panels run a dummy engine on a
thread, paused before reading, so the snapshot the test computes from is the one drawn."""
from __future__ import annotations

import math
import re

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.workload.own_prompts import own_request_id
from roseplay.tui.widgets.requests import fmt_ms
from roseplay.tui.widgets.step_strip import STRIP_MAX, StepStrip
from roseplay.tui.widgets.timing import TimingStats
from roseplay.tui.widgets.token_choice import pct, token_label
from tests.roseplay.tui.helpers import (fast_idle, live_source, notices, screen_text, settle, sync,
                                        wait_for, widget_text)

pytestmark = pytest.mark.timeout(240)


async def _paused(pilot, app, src, ready, timeout=90.0):
    """Run until `ready(snapshot)`, pause, and redraw from the settled snapshot."""
    assert await wait_for(pilot, lambda: ready(src.snapshot()), timeout)
    await pilot.press("space")
    await settle(pilot, src)
    app.refresh_panels()
    await pilot.pause()
    return src.snapshot()


def _strip_expected(snap, width: int) -> tuple[str, str]:
    """The strip's two lines of numbers, computed here from the snapshot's steps."""
    steps = snap.recent_steps[-min(width, STRIP_MAX):]
    mixed = len([s for s in steps if s.decode_tokens > 0 and s.prefill_tokens > 0])
    prefill = len([s for s in steps if s.prefill_tokens > 0 and s.decode_tokens == 0])
    use = 100 * sum((s.decode_tokens + s.prefill_tokens) / s.budget for s in steps) / len(steps)
    start = steps[0].wall_time - steps[0].duration
    firsts = [r for r in snap.requests if r.ttft is not None and r.prefill_chunks > 0
              and r.arrival_time + r.ttft >= start]
    chunks = sum(r.prefill_chunks for r in firsts) / len(firsts)
    return (f"{len(steps)} steps: mixed {mixed}, prefill-only {prefill}, decode-only "
            f"{len(steps) - mixed - prefill}",
            f"used {use:.0f}% · {chunks:.1f} chunks/prompt ({len(firsts)})")


@sync
async def test_the_step_strip_reads_the_budget_and_mode_as_numbers(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(engine=dict(max_num_batched_tokens=32, enable_prefix_caching=False),
                      concurrency=6, input_len=48)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            snap = await _paused(pilot, app, src, lambda s: s.step >= 40 and sum(
                r.ttft is not None for r in s.requests) >= 3)
            strip = app.query_one(StepStrip)
            text = widget_text(strip)
            for line in _strip_expected(snap, strip.size.width):
                assert line in text
            assert "budget 32 used" in text
            top = max(s.decode_tokens + s.prefill_tokens
                      for s in snap.recent_steps[-strip.size.width:])
            assert f"full height {top} tok · budget 32" in text
            # two knob changes, each followed by steps: the strip names both, in order
            await pilot.press("minus")
            for _ in range(3):
                await pilot.press("n")
            await pilot.press("m")
            for _ in range(3):
                await pilot.press("n")
            await settle(pilot, src)
            app.refresh_panels()
            await pilot.pause()
            snap, text = src.snapshot(), widget_text(strip)
            assert [(s.budget, s.mode) for s in snap.recent_steps[-3:]] == [(16, "prefill-first")] * 3
            assert "32 budget → 16 budget → 16 prefill-first" in text
            assert _strip_expected(snap, strip.size.width)[0] in text
            assert not any(s.decode_tokens and s.prefill_tokens for s in snap.recent_steps[-3:])
    finally:
        src.close()


@sync
async def test_the_ttft_split_adds_up_in_selected_and_timing(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(engine=dict(max_num_batched_tokens=16, max_num_seqs=2,
                                  enable_prefix_caching=False), concurrency=5, input_len=40)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(200, 60)) as pilot:    # every part whole (120x40: cut)
            snap = await _paused(pilot, app, src, lambda s: any(
                r.state == "finished" and r.prefill_chunks > 1 for r in s.requests) and any(
                r.queued_time and r.queued_time > 0.05 for r in s.requests if r.ttft))
            view = next(r for r in snap.requests if r.state == "finished" and r.prefill_chunks > 1)
            app.requests.select(view.request_id)
            app.refresh_panels()
            await pilot.pause()
            queued, prefill, last = view.ttft_split()
            assert queued + prefill + last == pytest.approx(view.ttft, abs=1e-9)
            n = view.prefill_chunks
            detail = " ".join(widget_text(app.detail).split())
            assert f"TTFT {fmt_ms(view.ttft)}" in detail
            assert f"queue {fmt_ms(queued)}" in detail
            chunks = f"chunks 1-{n - 1}" if n > 2 else "chunk 1"
            assert f"{chunks} {fmt_ms(prefill)}" in detail
            assert f"{n}→token {fmt_ms(last)}" in detail
            # Timing: each part's share of the TTFT of the requests whose first token came
            # in its 10 s window (its TTFT row's)
            rows = [r.ttft_split() for r in app.window.requests(snap)
                    if r.ttft is not None and r.arrival_time + r.ttft >= snap.time - 10]
            sums = [sum(x[i] for x in rows) for i in (0, 1, 2)]
            timing = widget_text(app.query_one(TimingStats))
            shown = re.search(r"└ queue (\d+)% prefill (\d+)% last (\d+)%", timing)
            assert shown, timing                  # whole percents that add up to 100
            assert sum(map(int, shown.groups())) == 100
            for v, pct in zip(sums, map(int, shown.groups())):
                assert abs(pct - 100 * v / sum(sums)) < 1, timing
    finally:
        src.close()


@sync
async def test_the_scrub_walks_a_typed_prompt_token_by_token(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source()
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            rid = src.submit("tell me a story", sampling={"max_tokens": 6, "temperature": 0,
                                                          "logit_bias": {7: 3.0}})
            await _paused(pilot, app, src, lambda s: app.traces.get(rid) is not None)
            trace = app.traces.get(rid)
            assert len(trace) == trace.num_tokens == 6 and trace.raw_logprobs
            app.requests.select(rid)
            app.refresh_panels()
            await pilot.pause()
            assert "w tokens" in widget_text(app.detail)
            await pilot.press("w")
            for i, keys in ((0, ()), (1, ("right",)), (5, ("end",)), (4, ("left",)),
                            (0, ("home",))):
                await pilot.press(*keys)
                await pilot.pause()
                text = screen_text(app)
                assert f"token {i + 1} of 6" in text
                lp = trace.logprobs_at(i)
                sampled = lp.token_ids[0]
                # the sampled token's row: the model's p, then p after the bias
                raw_p = dict(zip(lp.raw.token_ids[1:], lp.raw.logprobs[1:]))
                after = f"{pct(math.exp(lp.logprobs[0])):>8}"
                model = f"{pct(math.exp(raw_p[sampled])):>8}" if sampled in raw_p else "–".rjust(8)
                assert f"▶ {token_label(sampled, None):>12} {model} {after}" in text
            await pilot.press("escape")
            assert "token 1 of 6" not in screen_text(app)
    finally:
        src.close()


@sync
async def test_a_typed_prompt_stays_selected_and_walkable_after_others_end(monkeypatch):
    """A newcomer types a prompt and looks a few seconds later: a snapshot shows only the
    latest RECENT_FINISHED ended requests (2 here; seconds' worth under load), yet the
    prompt (it asks for its trace: engine/core/core.py RECENT_TRACED) keeps its row,
    selected and finished, and `w` walks its tokens."""
    from engine.core import core as core_mod
    monkeypatch.setattr(core_mod, "RECENT_FINISHED", 2)
    fast_idle(monkeypatch)
    src = live_source(concurrency=4)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            await pilot.press("i", *"to be")
            app.query_one("#prompt-sampling").value = "max_tokens=8"
            await pilot.press("enter", "escape")
            rid = own_request_id(1)
            assert await wait_for(pilot, lambda: getattr(src.snapshot().request(rid), "state",
                                                         None) == "finished", 60)
            n0 = src.snapshot().counters.finished
            assert await wait_for(pilot, lambda: src.snapshot().counters.finished >= n0 + 6, 60)
            app.refresh_panels()
            await pilot.pause()
            row = app.requests.current
            assert row is not None and row.request_id == rid and row.state == "finished"
            assert "w tokens" in widget_text(app.detail)
            await pilot.press("w")
            n = len(app.traces.get(rid))
            assert await wait_for(pilot, lambda: f"token 1 of {n}" in screen_text(app), 10)
    finally:
        src.close()


@sync
async def test_w_says_why_a_request_has_no_trace(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(engine=dict(max_num_seqs=2), concurrency=2)
    app = RoseplayApp(source=src)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            snap = await _paused(pilot, app, src, lambda s: any(
                r.state == "finished" for r in s.requests))
            plain = next(r for r in snap.requests if r.state == "finished"
                         and app.traces.get(r.request_id) is None)
            app.requests.select(plain.request_id)
            await pilot.press("w")
            await pilot.pause()
            assert f"{plain.request_id} has no token trace" in notices(app)
            assert "Tokens of" not in screen_text(app)
    finally:
        src.close()


def test_an_unfinished_ttft_counts_the_chunks_the_request_list_counts():
    """A prefilling request's Selected line counts the chunks computed, as the request
    list's "chunk k/n" does, and names a chunk scheduled in the step in flight; a
    narrow panel gets a shorter form, not a cut one."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.ttft_split import request_split
    r = SimpleNamespace(ttft_split=lambda: None, ttft=None, scheduled_ts=1.0, state="prefilling",
                        queued_time=0.5, arrival_time=0.0, prefill_chunks=11, chunks_done=10,
                        preemptions=0)
    assert request_split(r, now=2.0).plain == (
        "TTFT: queued 500ms, then 10 chunks computed so far, 1 in flight")
    assert request_split(r, now=2.0, width=44).plain == (
        "TTFT: queued 500ms, 10 computed, 1 in flight")
    assert request_split(r, now=2.0, width=43).plain == "TTFT: queued 500ms, 10 computed"
    r.preemptions = 1           # chunks scheduled before a preemption are not in flight
    assert request_split(r, now=2.0).plain == "TTFT: queued 500ms, then 10 chunks computed so far"
    r.preemptions, r.chunks_done = 0, 11
    assert request_split(r, now=2.0).plain == "TTFT: queued 500ms, then 11 chunks computed so far"

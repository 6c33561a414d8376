"""The lesson panels on built snapshots (no engine): a speculative token trace walked
with `w` (accepted drafts, the correction, the bonus, the verify's tokens emitted at
once), speculation's method and k in This step and the ITL line under the Timing plot
(its numbers computed here from the snapshot), and where the step strip shows."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.outputs import TOKEN_BONUS, TOKEN_CORRECTION, TOKEN_DRAFT, TokenTrace
from roseplay.tui.app import RoseplayApp
from roseplay.tui.layout import plan
from roseplay.tui.widgets.step import StepPanel
from roseplay.tui.widgets.step_strip import StepStrip
from tests.roseplay.tui.helpers import (StaticSource, screen_text, session_snapshot, sync,
                                        widget_text)

pytestmark = pytest.mark.timeout(120)

D3 = 3 << 2          # drafts of the verify, above the origin bits


def _spec_trace(rid: str, t0: float) -> TokenTrace:
    """8 tokens: a plain one; a verify of 3 drafts, 2 accepted, then the correction; a
    verify of 3 accepted drafts and the bonus."""
    origin = bytes([0, TOKEN_DRAFT | D3, TOKEN_DRAFT | D3, TOKEN_CORRECTION | D3,
                    TOKEN_DRAFT | D3, TOKEN_DRAFT | D3, TOKEN_DRAFT | D3, TOKEN_BONUS | D3])
    times = np.array([t0, t0 + .05, t0 + .05, t0 + .05, t0 + .12, t0 + .12, t0 + .12, t0 + .12])
    ids = np.arange(100, 108, dtype="<i4")
    return TokenTrace(rid, 8, ids.tobytes(), times.astype("<f8").tobytes(), origin)


def _flat(app) -> str:
    """The screen's words, the lines of a box joined (its borders left out)."""
    return " ".join(" ".join(line.strip(" │╭╮╰╯").split())
                    for line in screen_text(app).splitlines())


def _spec_snapshot():
    snap = session_snapshot(12)
    view = next(r for r in snap.requests if r.state == "finished")
    knobs = snap.knobs.replace(num_speculative_tokens=3)
    last = dataclasses.replace(snap.last_step, spec_verified=2, spec_draft_tokens=6,
                               spec_accepted_tokens=5, spec_drafted_per_pos=(2, 2, 2),
                               spec_accepted_per_pos=(2, 2, 1))
    steps = snap.recent_steps[:-1] + (last,)
    # 10 gaps in the window, 4 of them 0 (tokens of one verify), 2 before it
    itls = tuple((snap.time - 20, 0.0) for _ in range(2)) + tuple(
        (snap.time - 1 - i * 0.1, 0.0 if i < 4 else 0.03) for i in range(10))
    return dataclasses.replace(snap, knobs=knobs, spec_method="draft_model", recent_steps=steps,
                               last_step=last, recent_itls=itls,
                               traces=(_spec_trace(view.request_id, snap.time - 2),)), view


@sync
async def test_w_walks_the_drafts_the_correction_and_the_bonus():
    snap, view = _spec_snapshot()
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(120, 40)) as pilot:
        app.refresh_panels()
        app.requests.select(view.request_id)
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        expect = {1: ("plain: the target sampled it", "the first token"),
                  2: ("draft 1 of 3, accepted by the target",
                      "its verify: 3 drafted → 2 accepted, tokens 2-4 emitted at once"),
                  3: ("draft 2 of 3, accepted", "gap 0.0ms after token 2 (same step)"),
                  4: ("correction: the target's token in place of rejected draft 3 of 3",
                      "tokens 2-4 emitted at once"),
                  5: ("draft 1 of 3, accepted", "gap 70.0ms after token 4"),
                  8: ("bonus: the target's token after all 3 drafts were accepted",
                      "its verify: 3 drafted → 3 accepted, tokens 5-8 emitted at once")}
        for i in range(1, 9):
            text = _flat(app)
            assert f"token {i} of 8" in text
            for words in expect.get(i, ()):
                assert words in text, (i, words)
            await pilot.press("right")
        assert "origin ·ddcdddb" in _flat(app)
        assert "no distribution: it asked for no logprobs" in _flat(app)


@sync
async def test_this_step_and_timing_name_the_method_k_and_the_bursts():
    snap, _ = _spec_snapshot()
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(200, 60)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        step = widget_text(app.query_one(StepPanel))
        assert "spec 6 drafted → 5 accepted (83%, 2 req, draft_model k=3)" in step
        start = snap.time - 10
        gaps = [g for t, g in snap.recent_itls if t >= start]
        zero = 100 * sum(g == 0 for g in gaps) / len(gaps)
        steps = [s for s in snap.recent_steps if s.wall_time >= start]
        per_verify = 1 + sum(s.spec_accepted_tokens for s in steps) / sum(
            s.spec_verified for s in steps)
        note = widget_text(app.query_one("#spec-note"))
        assert (f"spec draft_model k=3: {per_verify:.1f} tok/verify at once → "
                f"{zero:.0f}% of ITL gaps 0 ms") in note
        # under the ITL plot, right where the bursts show
        order = [w.id for w in app.query_one("#plots").children if w.display]
        assert order.index("spec-note") == order.index("plot-itl") + 1
        strip = widget_text(app.query_one(StepStrip))
        assert "spec draft_model k=3: 6 drafted → 5 accepted (83%) in 2 verifies" \
            " · by pos 100 100 50%" in strip


@sync
async def test_no_burst_line_without_speculation():
    snap = session_snapshot(12)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(200, 60)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        assert not app.query_one("#spec-note").display
        assert "spec" not in widget_text(app.query_one(StepStrip))


def test_the_strip_shows_from_120x40_and_zooms_at_80x24():
    assert "strip" in plan(120, 40).heights and "strip" in plan(200, 60).heights
    small = plan(80, 24)
    assert "strip" not in small.heights and "Steps" in small.note
    assert plan(80, 24, zoom="strip").heights == {"strip": None}


@sync
async def test_the_help_says_how_often_the_panels_redraw():
    """It said "Every panel redraws 12 times a second": the Timing figures redraw every
    UPDATE_EVERY s, a paused engine's panels on each step and key."""
    from roseplay.tui.app import REFRESH_HZ
    from roseplay.tui.widgets.help import HelpScreen
    from roseplay.tui.widgets.timing import UPDATE_EVERY
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        intro = " ".join(_flat(app).split())
        assert "Every panel redraws" not in intro
        assert (f"up to {REFRESH_HZ:g} times a second (the Timing figures "
                f"{1 / UPDATE_EVERY:g} times") in intro, intro

"""A figure said to be over a window is over that window: a snapshot holds only the latest
2048 token gaps and 256 steps (engine/core/stats.py), which 16 requests decoding on the
bundled CPU model fill in under 2 s and 4 s, so the Timing table's "10 s" ITL, the
compare table's and a guide scorecard's ITL and mixed steps read the last seconds only.
Built snapshots: two frames, each with a full list of gaps (steps) of its own."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.guides.check import Window
from roseplay.tui.widgets.ratios import side_metrics
from roseplay.tui.widgets.requests import fmt_ms
from roseplay.tui.widgets.ttft_split import window_split
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(120)
FULL = 2048          # RECENT_SAMPLES: the gaps a snapshot holds


def _frames():
    """Two frames 1 s apart: 2048 gaps of 50 ms in the first second, 2048 of 10 ms in the
    next (the second frame's list holds only its own)."""
    snap = session_snapshot(12)
    t = snap.time
    first = dataclasses.replace(snap, time=t + 1, recent_itls=tuple(
        (t + (i + 1) / FULL, 0.050) for i in range(FULL)))
    second = dataclasses.replace(snap, time=t + 2, recent_itls=tuple(
        (t + 1 + (i + 1) / FULL, 0.010) for i in range(FULL)))
    return first, second


@sync
async def test_the_timing_table_and_compare_itl_count_every_gap_of_the_window():
    """The table's ITL p95 read 10.0ms: the second frame's gaps only."""
    first, second = _frames()
    app = RoseplayApp(source=StaticSource(first))
    async with app.run_test(size=(120, 40)) as pilot:
        for snap in (first, second):
            app.source.snap = snap
            app.timing.reset_shown()
            app.refresh_panels()
            await pilot.pause()
        gaps = [0.050] * FULL + [0.010] * FULL
        p50, p95 = (fmt_ms(float(np.percentile(gaps, q))) for q in (50, 95))
        table = widget_text(app.timing.stats)
        assert re.search(rf"ITL +{p50} +{p95} ", table), table
        assert side_metrics(second, app.window, {})["itl_p50"] == pytest.approx(
            float(np.percentile(gaps, 50)))


def test_a_guide_window_counts_every_gap_and_step_it_saw():
    """A scorecard's ITL and mixed steps read the last 256 steps and 2048 gaps."""
    first, second = _frames()
    step = first.recent_steps[-1]
    prefill_only = dataclasses.replace(step, decode_tokens=0, prefill_tokens=16)
    mixed = dataclasses.replace(step, decode_tokens=4, prefill_tokens=16)
    base, t = first.step, first.time - 1
    first = dataclasses.replace(first, step=base + 256, recent_steps=tuple(
        dataclasses.replace(mixed, step=base + 1 + i, wall_time=t + (i + 1) / 256)
        for i in range(256)))
    second = dataclasses.replace(second, step=base + 512, recent_steps=tuple(
        dataclasses.replace(prefill_only, step=base + 257 + i, wall_time=t + 1 + (i + 1) / 256)
        for i in range(256)))
    start = dataclasses.replace(first, time=t, step=base, recent_itls=(), recent_steps=())
    window = Window(start)
    for snap in (first, second):
        window.feed(snap)
    result = window.result()
    assert result["mixed_steps"] == pytest.approx(0.5)        # it read 0.0
    gaps = [0.050] * FULL + [0.010] * FULL
    assert result["itl_p50"] == pytest.approx(float(np.percentile(gaps, 50)))
    assert result["itl_p99"] == pytest.approx(0.050)           # it read 10 ms
    assert window.counts()["token gaps"] == 2 * FULL


@sync
async def test_the_speculation_note_counts_the_gaps_and_verifies_of_the_window():
    """Guide d on the bundled model: ITL p50 0.0ms over 10 s, and under it "45% of ITL
    gaps 0 ms" of the last 2048 gaps (under a second of its one request)."""
    first, second = _frames()
    step = first.recent_steps[-1]
    t = first.time - 1
    verify = dataclasses.replace(step, spec_verified=1, spec_accepted_tokens=3)
    plain = dataclasses.replace(step, spec_verified=0, spec_accepted_tokens=0)
    base = first.step
    first = dataclasses.replace(first, step=base + 256, recent_itls=tuple(
        (x, 0.0) for x, _ in first.recent_itls), recent_steps=tuple(
        dataclasses.replace(verify, step=base + 1 + i, wall_time=t + (i + 1) / 256)
        for i in range(256)))
    second = dataclasses.replace(second, step=base + 512, recent_steps=tuple(
        dataclasses.replace(plain, step=base + 257 + i, wall_time=t + 1 + (i + 1) / 256)
        for i in range(256)))
    app = RoseplayApp(source=StaticSource(first))
    async with app.run_test(size=(200, 60)) as pilot:
        for snap in (first, second):
            app.source.snap = dataclasses.replace(snap, knobs=snap.knobs.replace(
                num_speculative_tokens=3), spec_method="ngram",
                last_step=dataclasses.replace(plain, spec_off=0))
            app.timing.reset_shown()
            app.refresh_panels()
            await pilot.pause()
        note = widget_text(app.query_one("#spec-note"))
        assert "4.0 tok/verify at once → 50% of ITL gaps 0 ms" in note, note


def test_a_window_keeps_the_steps_of_replicas_merged_by_time():
    """Replicas number their own steps: a merged snapshot orders them by time, and a
    window that read the newest by number stopped at the other replica's lower ones."""
    from roseplay.tui.widgets.counters import CounterWindow
    snap = session_snapshot(12)
    step, t = snap.recent_steps[-1], snap.time
    frames = []
    for k in range(2):      # replica A at steps 500…, B at 100…, interleaved in time
        steps = tuple(dataclasses.replace(step, step=(500 if i % 2 else 100) + 10 * k + i,
                                          wall_time=t + k + (i + 1) / 20) for i in range(20))
        frames.append(dataclasses.replace(snap, time=t + k + 1, recent_steps=steps))
    window = CounterWindow()
    for frame in frames:
        window.feed(frame)
    assert len(window.steps()) == 40


@sync
async def test_the_ttft_split_line_counts_the_requests_of_the_ttft_row():
    """The `└ queue/prefill/last` line read the requests that finished in the window
    (recent_ttft_parts) while the TTFT row above it read those whose first token came in
    it: one that finished now after its first token 19 s ago set the shares alone."""
    snap = session_snapshot(12)
    t, base = snap.time, snap.requests[0]
    old = dataclasses.replace(base, request_id="old", state="finished", arrival_time=t - 20,
                              ttft=1.0, scheduled_ts=t - 19.1, last_chunk_ts=t - 19.05)
    new = dataclasses.replace(base, request_id="new", state="decoding", arrival_time=t - 3,
                              ttft=2.0, scheduled_ts=t - 2.5, last_chunk_ts=t - 1.5)
    snap = dataclasses.replace(snap, requests=(old, new),
                               recent_ttft_parts=((t - 0.5, 0.9, 0.05, 0.05),))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(120, 40)) as pilot:
        app.timing.reset_shown()
        app.refresh_panels()
        await pilot.pause()
        table = widget_text(app.timing.stats)
    assert re.search(r"TTFT +2000ms +2000ms", table), table      # "new" alone
    assert "└ queue 25% prefill 50% last 25%" in table, table     # its split: 0.5+1.0+0.5


@pytest.mark.parametrize("parts, shown", [
    ((1.0, 1.0, 1.0), "queue 34% prefill 33% last 33%"),        # read 33% 33% 33%
    ((0.125, 0.125, 0.75), "queue 13% prefill 12% last 75%"),   # read 12% 12% 75%
    ((0.335, 0.335, 0.33), "queue 34% prefill 33% last 33%"),   # read 34% 34% 33%
])
def test_the_ttft_split_lines_shares_add_up_to_100(parts, shown):
    """The `└` line's shares are rounded together (largest remainder): one by one they
    summed to 99 % or 101 %."""
    snap = session_snapshot(12)
    t, base = snap.time, snap.requests[0]
    queued, prefill, last = parts
    r = dataclasses.replace(base, request_id="r", state="decoding", arrival_time=t - 5,
                            ttft=queued + prefill + last, scheduled_ts=t - 5 + queued,
                            last_chunk_ts=t - 5 + queued + prefill)
    line = window_split([r], t - 10).plain
    assert shown in line, line
    assert sum(map(int, re.findall(r"(\d+)%", line))) == 100

"""What a newcomer read wrong after the basics: a time axis word half covered by a knob's
label, the waiting reason of a full pool, a cut speculation line (built data, no
engine)."""
from __future__ import annotations

import dataclasses
import re

import pytest
from textual.app import App

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.plots import Plot, TimeAxis
from roseplay.tui.widgets.step import StepPanel
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(60)
N = 46                                       # the axis's columns at 120x40


async def _axis(marks: list, stopped: bool = False) -> str:
    class AxisApp(App):
        def compose(self):
            yield TimeAxis()
    app = AxisApp()
    async with app.run_test(size=(Plot.LABEL + N, 3)) as pilot:
        axis = app.query_one(TimeAxis)
        axis.show(marks, stopped)
        await pilot.pause()
        return widget_text(axis).splitlines()[0]


@sync
async def test_a_mark_label_never_leaves_part_of_an_axis_word():
    """A label over part of `now` left `▲preempt swapow`, over `-23 s` `-23▲…`: each of
    the axis's words shows whole or not at all."""
    for at in range(22, N):
        marks = [""] * N
        marks[at] = "preempt swap"
        marks[3] = "spec k 3"
        line = (await _axis(marks))[len("time →"):].strip()
        words = [w for w in re.split(r"─+|▲\w+(?: \w+)*", line) if w.strip()]
        assert set(words) <= {"-23 s", "-12 s", "now"}, line
        assert "▲preempt swap" in line, line


@sync
async def test_the_axis_words_show_without_marks():
    line = await _axis([""] * N)
    assert line.startswith("time →") and "-23 s" in line and "-12 s" in line
    assert line.rstrip().endswith("now") and (await _axis([], True)).rstrip().endswith("stop")


def _speculating(snap, disable_at: int = 0, chunks: tuple = ()):
    """Seven requests verified 21 drafts this step, 4 accepted, n-gram k=3 (120x40 cut
    this to `(19%, 7 req, ngram k…`, and with a prefill chunk after it to `ngram k=…`)."""
    step = dataclasses.replace(snap.last_step, spec_verified=7, spec_draft_tokens=21,
                               spec_accepted_tokens=4, prefill_chunks=chunks,
                               spec_off=40 if disable_at else 0)
    return dataclasses.replace(snap, last_step=step, spec_method="ngram",
                               spec_disable_by_batch_size=disable_at,
                               knobs=snap.knobs.replace(num_speculative_tokens=3))


@pytest.mark.parametrize("size", [(120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("disable_at", [0, 1])
@pytest.mark.parametrize("chunked", [False, True])
@sync
async def test_this_steps_speculation_line_is_whole(size, disable_at, chunked):
    chunks = session_snapshot(0).last_step.prefill_chunks if chunked else ()
    snap = _speculating(session_snapshot(12), disable_at, chunks)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        for _ in range(2):
            app.refresh_panels()
            await pilot.pause()
        text = widget_text(app.query_one(StepPanel))
        line = next(row for row in text.splitlines() if "spec" in row)
        assert chunked or not line.rstrip("│ ").endswith("…"), line   # (chunks: cut after)
        if disable_at:
            assert re.search(r"spec .*off: 40 decoding > (disable_by_batch_size )?1\b", line), line
        else:
            assert re.search(r"spec 21 drafted → 4 accepted \(19%.* k=3\b", line), line


class PlotApp(App):
    """A TTFT plot alone, as the Timing panel draws it."""
    def compose(self):
        yield Plot("TTFT", "decode", lambda v: f"{v:.0f}ms")


@pytest.mark.parametrize("height", [1, 2])
@sync
async def test_a_small_value_under_a_tall_scale_is_drawn_not_blank(height):
    """Guide d after the default workload: TTFT points of 8 ms under the 1453 ms the
    minute before set were blank, the same as points with no first token in them."""
    app = PlotApp()
    async with app.run_test(size=(Plot.LABEL + 20, 4)) as pilot:
        plot = app.query_one(Plot)
        plot.styles.height = height
        plot.show([1453.0] * 10 + [8.0] * 8 + [float("nan"), 0.0])
        await pilot.pause()
        bottom = widget_text(plot).splitlines()[height - 1][Plot.LABEL:]
        assert bottom[10:18] == "▁" * 8, bottom
        assert bottom[18:] == "  "                 # no point, and 0: nothing to draw


@sync
async def test_a_sort_that_puts_finished_rows_first_still_follows_an_active_request():
    """Sorted by TTFT the finished rows come first: with nothing chosen the list followed
    nothing, the Selected panel asked to pick one, and Esc ("follows the newest") did
    not help. It follows the first active row of the list now."""
    from roseplay.tui.widgets.request_detail import RequestDetail
    from roseplay.tui.widgets.requests import ACTIVE, RequestList
    snap = session_snapshot(12)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(120, 40)) as pilot:
        lst = app.query_one(RequestList)
        while lst.sort != "TTFT":
            await pilot.press("o")
        await pilot.press("escape")
        app.refresh_panels()
        await pilot.pause()
        assert lst.rows[0].state not in ACTIVE                  # (the sort's point)
        first = next(r for r in lst.rows if r.state in ACTIVE)
        assert lst.current is first
        assert first.request_id in widget_text(app.query_one(RequestDetail))


def _finished(snap, first: int, last: int) -> tuple:
    """Requests f-first … f-last, each finished 2 s before the snapshot (10 tokens)."""
    done = next(r for r in snap.requests if r.state == "finished")
    return tuple(dataclasses.replace(done, request_id=f"f-{i}", arrival_time=snap.time - 2.2,
                                     ttft=0.1 + i / 1000, tpot=0.01, output_tokens=10)
                 for i in range(first, last + 1))


@sync
async def test_goodput_counts_every_request_the_window_finished():
    """A snapshot keeps the latest 64 finished requests: with 100 done in the window the
    Timing line read "good 100% of 64" beside "120 req done". The app keeps what it saw."""
    from roseplay.tui.widgets.timing import TimingStats
    base = session_snapshot(12)
    source = StaticSource(dataclasses.replace(base, requests=_finished(base, 1, 64)))
    app = RoseplayApp(source=source, slos={"ttft": 1000.0})
    async with app.run_test(size=(120, 40)) as pilot:
        for lo, hi, dt in ((1, 64, 0.0), (37, 100, 0.1)):
            source.snap = dataclasses.replace(base, requests=_finished(base, lo, hi),
                                              time=base.time + dt)
            app.timing._shown_at = (None, -1.0)
            app.refresh_panels()
            await pilot.pause()
        text = widget_text(app.query_one(TimingStats))
        assert "good 100% of 100" in text, text


@sync
async def test_a_message_longer_than_its_line_says_it_was_cut():
    """A knob's explanation on the message line was cut at a word ("… in one forward
    (speculative"), nothing showing that more was left out."""
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(80, 24)) as pilot:
        app.notify("num_speculative_tokens: Draft tokens proposed per decoding request per "
                   "step and verified in one forward (speculative decoding) " * 2)
        await pilot.pause()
        line = widget_text(app.note).rstrip()
        assert line.endswith("…") and line.startswith(" · num_speculative_tokens"), line


@pytest.mark.parametrize("size", [(120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_the_strips_budget_line_keeps_chunks_per_prompt_with_a_mode_named(size):
    """`m` to prefill-first: the line wrapped at 120x40, its end below the panel, and
    read `budget 512 prefill-first used 5% · 1.0`, a number without its unit."""
    from roseplay.tui.widgets.step_strip import StepStrip
    snap = session_snapshot(12)
    steps = tuple(dataclasses.replace(s, mode="mixed-chunk" if i < 5 else "prefill-first",
                                      budget=512) for i, s in enumerate(snap.recent_steps))
    snap = dataclasses.replace(snap, recent_steps=steps, last_step=steps[-1],
                               knobs=snap.knobs.replace(scheduling_mode="prefill-first",
                                                        max_num_batched_tokens=512))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        for _ in range(2):
            app.refresh_panels()
            await pilot.pause()
        strip = app.query_one(StepStrip)
        assert strip.display and strip.size.height
        line = next(row for row in widget_text(strip).splitlines() if "prefill-first" in row)
        line = line.strip("│ ")
        assert re.search(r"· (\d+\.\d (chunks/prompt|per prompt)|no first token"
                         r"( in these steps)?)$", line), line
        # the short "no first token" goes with the short form only (the long one wrapped
        # there: "budget 512 prefill-first used 3% · no first token")
        assert line.endswith("in these steps") or not line.startswith("budget"), line


def test_a_finished_ttft_split_fits_the_selected_panel_at_80x24():
    """The 42-column panel cut `TTFT 1430ms = queue 1397ms + 1→token 32.2…`: its last
    part lost its unit. A tight form fits whole."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.ttft_split import request_split
    r = SimpleNamespace(ttft_split=lambda: (1.3974, 0.0, 0.0322), ttft=1.4296,
                        prefill_chunks=1, prefill_preemptions=0)
    assert request_split(r, now=2.0, width=42).plain == "TTFT 1430ms=queue 1397ms+1→token 32.2ms"
    assert request_split(r, now=2.0, width=44).plain == \
        "TTFT 1430ms = queue 1397ms + 1→token 32.2ms"


@pytest.mark.parametrize("width", [62, 70, 120])
def test_the_strips_speculation_line_keeps_its_positions(width):
    """At 160x48 (70 columns) the line wrapped, leaving `… in 426 verifies ·` and the
    acceptance by position below the panel. Each width gets a whole form with them."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.step_strip import spec_line
    n = SimpleNamespace(drafted=1250, accepted=116, verified=426, drafted_by_pos=(426, 420, 404),
                        accepted_by_pos=(85, 25, 6), spec_off=12)
    snap = SimpleNamespace(knobs=SimpleNamespace(num_speculative_tokens=3), spec_method="ngram",
                           spec_disable_by_batch_size=32)
    line = spec_line(n, snap, width).plain
    assert len(line) <= width and "by pos 20 6 1%" in line, line
    assert "1250" in line and "116" in line and "(9%)" in line and "off in 12 steps" in line
    narrow = spec_line(n, snap, 40).plain           # too narrow for all: whole words
    assert len(narrow) <= 40 and not narrow.endswith(("·", "…")), narrow
    assert spec_line(n, snap).plain == (
        "spec ngram k=3: 1250 drafted → 116 accepted (9%) in 426 verifies · by pos 20 6 1% · "
        "off in 12 steps (> disable_by_batch_size 32 decoding)")


@sync
async def test_a_plot_label_never_runs_into_its_bars():
    """At 200x60 the TTFT label read `TTFT 1179ms/1792ms▄▄`: 18 characters, the whole
    label column, and the bars started right after it."""
    app = PlotApp()
    async with app.run_test(size=(Plot.LABEL + 20, 4)) as pilot:
        plot = app.query_one(Plot)
        for values in ([1792.0] * 4 + [1179.0], [179.0] * 4 + [17.0]):
            plot.show(values)
            await pilot.pause()
            line = widget_text(plot).splitlines()[0]
            assert line[Plot.LABEL - 1] == " ", line
            assert line.startswith(f"TTFT {values[-1]:.0f}ms"), line
        assert line.startswith("TTFT 17ms/179ms "), line       # the scale where it fits


def test_a_chunked_prompts_ttft_split_fits_the_selected_panel_at_80x24():
    """The 42-column panel cut `TTFT 1550ms=queue 1397ms+chunks 1-3 120ms+4→…`: the
    last chunk's part lost its figure. The compact form adds the chunks together."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.ttft_split import request_split
    r = SimpleNamespace(ttft_split=lambda: (1.3974, 0.120, 0.0322), ttft=1.5496,
                        prefill_chunks=4, prefill_preemptions=0)
    assert request_split(r, now=2.0, width=42).plain == "TTFT 1550ms=queue 1397ms+4 chunks 152ms"
    assert "chunk 4→token 32.2ms" in request_split(r, now=2.0, width=80).plain
    r.prefill_chunks = 12
    assert request_split(r, now=2.0, width=42).plain == "TTFT 1550ms=queue 1397ms+12 chunks 152ms"


@pytest.mark.parametrize("width", [42, 80])
def test_a_recorded_ttft_without_its_split_is_not_never_scheduled(width):
    """An older recording's requests have a TTFT and no scheduled_ts: the Selected panel
    read `TTFT: never scheduled` for a decoding request whose row said 24.8ms."""
    from types import SimpleNamespace

    from roseplay.tui.widgets.ttft_split import request_split
    r = SimpleNamespace(ttft_split=lambda: None, ttft=0.0248, state="decoding",
                        scheduled_ts=None, arrival_time=0.0)
    shown = request_split(r, now=2.0, width=width).plain
    assert shown.startswith("TTFT 24.8ms") and "never" not in shown, shown
    assert len(shown) <= width

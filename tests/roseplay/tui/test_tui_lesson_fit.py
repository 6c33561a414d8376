"""Issue 22: what the screen says and whether it fits, on built snapshots (no engine):
cut lines (defect 14), the KV map at 80x24 (13), the speculation plots and a zoomed
Timing panel (6), one TTFT population for the table and the plot (17), the decode path
on the top line, and the line a terminal shows before Textual starts (18)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from engine.codes import EV_PREFIX_HIT
from engine.outputs import TokenLogprobs
from engine.snapshot import EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.kv_panel import KVLegend, KVPanel
from roseplay.tui.widgets.request_detail import RequestDetail
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.step import StepPanel
from tests.roseplay.tui.helpers import (StaticSource, screen_text, session_snapshot, sync,
                                        widget_text)

pytestmark = pytest.mark.timeout(120)
SIZES = [(80, 24), (120, 40), (200, 60)]


async def _shown(app, pilot) -> None:
    app.refresh_panels()
    await pilot.pause()
    app.refresh_panels()
    await pilot.pause()


def _cut(text: str) -> list[str]:
    """Lines that end cut ("…" at the end; a block list's "…+N" says how many more)."""
    return [line for line in text.splitlines() if line.rstrip("│ ").endswith("…")]


def _busy(snap):
    """A snapshot with large counts, a spec verify this step and a one-block prefix hit:
    the numbers that made lines run out of room."""
    step = dataclasses.replace(snap.last_step, spec_verified=1, spec_draft_tokens=3,
                               spec_accepted_tokens=3, dedup_joined=12, preemptions=9)
    counters = dataclasses.replace(snap.counters, preemptions=912, evictions=12345,
                                   cow_copies=4321)
    knobs = snap.knobs.replace(num_speculative_tokens=3)
    events = (EngineEvent(snap.step, snap.time, EV_PREFIX_HIT, "w0-24", (33,), ""),)
    return dataclasses.replace(snap, last_step=step, counters=counters, knobs=knobs,
                               events=events)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_this_step_the_legend_and_events_keep_their_lines_whole(size):
    """"dedup 0…", "pref…", "COW…", "1 block(…" (and the legend's "digit when ref>1"
    beside a selected block's 1)."""
    app = RoseplayApp(source=StaticSource(_busy(session_snapshot(12))))
    async with app.run_test(size=size) as pilot:
        await _shown(app, pilot)
        for widget in (StepPanel, KVLegend, EventLog):
            w = app.query_one(widget)
            if w.display and w.size.height:
                assert not _cut(widget_text(w)), (size, widget_text(w))
        assert "ref>1" not in widget_text(app.query_one(KVLegend))


@sync
async def test_the_next_token_line_and_the_zoomed_table_fit():
    """The one-line distribution was cut inside a token; the zoomed table's header ran
    its legend off the panel."""
    snap = session_snapshot(12)
    raw = TokenLogprobs([5, 5, 9, 11, 13, 17], [-0.5, -0.5, -1.5, -2.0, -3.0, -4.0], 1)
    lp = TokenLogprobs([5, 5, 11, 9, 13, 17], [-0.4, -0.4, -1.4, -2.1, -3.0, -4.1], 1, raw)
    views = (dataclasses.replace(snap.requests[0], logprobs=lp), *snap.requests[1:])
    source = StaticSource(dataclasses.replace(snap, requests=views))
    source.kind = "live"
    source.info = type("Info", (), {"logprobs_mode": "processed_logprobs"})()
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _shown(app, pilot)
        detail = widget_text(app.query_one(RequestDetail))
        line = next(x for x in detail.splitlines() if "next token" in x)
        assert not line.rstrip("│ ").endswith(("%", "→")), detail     # no token cut in two
        app.set_zoom("detail")
        await _shown(app, pilot)
        rows = widget_text(app.query_one(RequestDetail)).splitlines()
        header = next(x for x in rows if "model p" in x)
        assert header.rstrip("│ ").endswith("after p"), header


@sync
async def test_the_kv_map_says_which_blocks_it_shows_at_80x24():
    """At 80x24 the map drew 174 of 512 blocks with no note."""
    snap = session_snapshot(12)
    state = np.resize(snap.block_state, 512).astype(np.int8)
    refcount = np.resize(snap.block_refcount, 512).astype(np.int32)
    big = dataclasses.replace(snap, num_blocks=512, block_state=state, block_refcount=refcount)
    app = RoseplayApp(source=StaticSource(big))
    async with app.run_test(size=(80, 24)) as pilot:
        await _shown(app, pilot)
        kv = app.query_one(KVPanel)
        first, end = kv.map.shown_blocks()
        assert end - first < 512
        assert kv.border_subtitle == f"0-{end - 1} of 512: scroll, z"     # short: fits
        assert f"0-{end - 1} of 512: scroll, z" in screen_text(app)
        legend = widget_text(app.query_one(KVLegend)).splitlines()[0]
        assert not legend.rstrip("│ ").endswith("…"), legend    # the selected id: whole or none


def test_chunk_k_of_n_is_never_cut_in_a_narrow_progress_column():
    """At 80x24 a prefilling row read `13/…`."""
    from roseplay.tui.widgets.requests import progress_cell
    view = dataclasses.replace(session_snapshot(12).requests[0], state="prefilling",
                               chunks_done=13, computed_tokens=416, prefill_target=600)
    text = "".join(seg.text for seg in progress_cell(view, 32, 8))
    assert len(text) == 8 and text.endswith("13/19"), text


@sync
async def test_the_help_explains_the_narrow_legend():
    from roseplay.tui.widgets.help import HelpScreen
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HelpScreen("live"))
        await pilot.pause()
        text = " ".join(app.screen.query_one("#help-body").source.split())
        for words in ("**f** free", "**ev** evicted", "**pre** or **p** preempted",
                      "**C** COW"):
            assert words in text


@pytest.mark.parametrize("size", [(120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_speculation_plots_show_and_a_zoomed_timing_panel_is_filled(size):
    """Guide d and `d` point at the acceptance plots, which never showed (cut after the
    hit rate); zooming left 2/3 of the panel blank."""
    snap = session_snapshot(12)
    snap = dataclasses.replace(snap, knobs=snap.knobs.replace(num_speculative_tokens=3))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=size) as pilot:
        await _shown(app, pilot)
        plots = app.query_one("#plots")
        for pid in ("#plot-accept", "#plot-alen"):
            plot = app.query_one(pid)
            assert plot.display and plot.region.bottom <= plots.region.bottom, pid
        app.set_zoom("timing")
        await pilot.pause(0.3)
        await _shown(app, pilot)
        shown = [p for p in app.timing.plots.values() if p.display]
        used = sum(p.outer_size.height for p in shown) + 1
        assert all(p.size.height > 1 for p in shown)
        assert plots.size.height - used < len(shown), (plots.size.height, used)


@sync
async def test_the_ttft_table_and_plot_count_the_same_requests():
    """TTFT plot 8006 ms vs table p50 1494 ms: the table counted finished requests, the
    plot the latest first tokens."""
    snap = session_snapshot(12)
    t = snap.time
    views = tuple(dataclasses.replace(r, state="decoding", arrival_time=t - 8.5 + 0.05 * i,
                                      ttft=8.0) for i, r in enumerate(snap.requests[:8]))
    latencies = tuple((t - 0.1, 1.5, 0.01) for _ in range(8))    # finished: fast turns
    app = RoseplayApp(source=StaticSource(dataclasses.replace(
        snap, requests=views, recent_latencies=latencies)))
    async with app.run_test(size=(120, 40)) as pilot:
        for i in range(4):                          # a few points for the plot
            app.source.snap = dataclasses.replace(app.source.snap, time=t - 1.5 + 0.5 * i)
            app.timing._shown_at = (None, -1.0)
            await _shown(app, pilot)
        table = widget_text(app.timing.stats)
        assert re.search(r"TTFT +8000ms", table), table
        assert app.timing.history.series["ttft"][-1] == pytest.approx(8.0)
        from roseplay.tui.widgets.ratios import side_metrics      # the compare table's too
        assert side_metrics(app.source.snap, app.window, {})["ttft_p50"] == pytest.approx(8.0)


@pytest.mark.parametrize("backend,words", [("cpu_native", "decode C layer (cpu_native)"),
                                           ("torch_sdpa", "decode torch_sdpa (no C layer)"),
                                           ("triton", "decode triton")])
@sync
async def test_the_top_line_names_the_decode_path(backend, words):
    snap = dataclasses.replace(session_snapshot(12), backend=backend)
    source = StaticSource(snap)
    source.kind, source.position = "live", lambda: ""
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _shown(app, pilot)
        assert words in widget_text(app.query_one(StatusBar))


def test_the_terminal_says_loading_before_textual_starts(tmp_path):
    """A blank screen for ~2.5 s before "loading": the first bytes are now the line."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time
    main, sub = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40")
    proc = subprocess.Popen([sys.executable, "-m", "roseplay", "--model", "dummy:tiny",
                             "--device", "cpu"], stdin=sub, stdout=sub, stderr=sub,
                            env=env, start_new_session=True)
    os.close(sub)
    out = b""
    try:
        deadline = time.monotonic() + 60     # until the line or the alternate screen:
        line = b"roseplay: loading dummy:tiny"     # (the load itself need not finish)
        while line not in out and b"\x1b[?1049h" not in out and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                try:
                    out += os.read(main, 4096)
                except OSError:
                    break
        first = out.split(b"\x1b[?1049h")[0]      # before the alternate screen
        assert line in first, out[:200]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(main)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_the_knobs_panel_shows_every_knob_and_the_workload(size):
    """At 120x40 the panel's 10 rows held the eight knobs, scenario and concurrency: the
    request rate's row (key r) and the help line were cut off unsaid."""
    from roseplay.tui.widgets.knobs import KnobsPanel
    source = StaticSource(session_snapshot(12))
    source.kind, source.position = "live", lambda: ""
    app = RoseplayApp(source=source)
    async with app.run_test(size=size) as pilot:
        await _shown(app, pilot)
        await _shown(app, pilot)
        panel = app.query_one(KnobsPanel)
        text = widget_text(panel)
        rows = text.splitlines()[1:-1]
        assert len(rows) == panel.size.height, text
        for key in ("c", "-/+", "[/]", "m", "p", "e", "h", "D/d"):
            assert any(row.startswith(f"│ {key:>4}  ") for row in rows), (key, text)
        assert re.search(r"\bs +shared-prefix .*</> +8 .*\br +∞", text.replace("\n", " ")), text
        assert not any(row.rstrip(" │").endswith("…") for row in rows
                       if "(? help)" not in row), text

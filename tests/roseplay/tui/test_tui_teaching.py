"""Issue 30's on-screen defects, each on a built or recorded snapshot (no engine): step
numbers, the palette's typed values, the help's words, the REC badge, `z` then `Z`, a map
whose refcount digits survive flashes, evictions as a rate, ctrl+c, and the start-up
checks that refuse an unusable pool or device before the app opens."""
from __future__ import annotations

import dataclasses
import gzip
import re

import numpy as np
import pytest

from engine.codes import EV_COW, EV_EVICT, EV_PREFIX_HIT
from engine.config import InvalidRequestError
from engine.snapshot import EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.tui.lifecycle import error_line
from roseplay.tui.commands import RoseplayCommands
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.help import HelpScreen
from roseplay.tui.widgets.kv_map import CACHED, CACHED_GLYPH, COW, KVMap
from roseplay.tui.widgets.kv_panel import KVLegend
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.step import StepPanel
from tests.roseplay.tui.helpers import (SESSION, StaticSource, screen_text, session_snapshot, sync,
                                        widget_text)

pytestmark = pytest.mark.timeout(120)


def _shared_block(snap) -> int:
    return int(np.flatnonzero((snap.block_state == 1) & (snap.block_refcount > 1))[0])


def _with(snap, *events):
    return dataclasses.replace(snap, events=tuple(events))


@sync
async def test_the_top_line_and_this_step_give_the_same_step_number():
    """A live engine's StepStats.step and snapshot step are both 1-based (engine/core/stats.py
    counts the step before recording it), so neither panel adds 1."""
    snap = session_snapshot(12)
    snap = dataclasses.replace(snap, last_step=dataclasses.replace(snap.last_step,
                                                                   step=snap.step))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(120, 40)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        top = re.search(r"step (\d+)", widget_text(app.query_one(StatusBar))).group(1)
        this = re.search(r"step (\d+)", widget_text(app.query_one(StepPanel))).group(1)
        assert top == this == str(snap.step)


async def _hits(app, query: str) -> list[str]:
    provider = RoseplayCommands(app.screen)
    return [str(h.text) for h in [h async for h in provider.search(query)]]


@sync
async def test_the_palette_runs_only_the_typed_value():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(120, 40)):
        # a typed value is the one hit: Enter can never run a fuzzy-matched key action
        assert await _hits(app, "cache off") == ["set enable_prefix_caching = off"]
        assert await _hits(app, "rate 5") == ["set rate = 5"]
        assert await _hits(app, "rate inf") == ["set rate = inf"]
        assert await _hits(app, "sort TTFT") == ["sort requests by TTFT"]
        assert len(await _hits(app, "sort")) > 1        # a name alone still lists the actions


@sync
async def test_help_says_the_engine_has_its_own_process_and_lists_every_key():
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HelpScreen("live"))
        await pilot.pause()
        text = " ".join(line.strip(" │") for line in screen_text(app).splitlines())
        assert "runs in its own process" in text and "in this process" not in text
    from roseplay.cli import build_parser
    helptext = build_parser().format_help()
    assert "in-process LLM" not in helptext
    for key in ("m/M scheduling mode", "p/P queue policy", "e eviction policy"):
        assert key in helptext


def test_the_rec_badge_shows_the_file_size(tmp_path):
    from roseplay.workload.record import Recorder
    snap = session_snapshot(12)
    path = tmp_path / "s.jsonl.gz"
    rec = Recorder(str(path), lambda: snap, lambda: {}, interval=60)
    rec.close()
    on_disk = path.stat().st_size
    assert rec.file_bytes() == on_disk < rec.bytes      # gzip: the file is the smaller
    with gzip.open(path, "rt") as fh:
        assert sum(len(line) for line in fh) == rec.bytes


@sync
async def test_zoom_then_back_restores_the_maps_digits():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(12)
        app.refresh_panels()
        await pilot.pause()
        kv = app.query_one(KVMap)
        before = kv.mode
        assert before in ("roomy", "tall", "digits")
        for keys in (("z",), ("z", "z")):
            await pilot.press(*keys)
            await pilot.pause(0.2)
            await pilot.press("Z")
            await pilot.pause(0.2)
            assert kv.mode == before, keys


@sync
async def test_a_flash_never_hides_a_refcount_digit_and_cached_blocks_are_a_shade():
    snap = session_snapshot(12)
    shared = _shared_block(snap)
    cached = np.flatnonzero(snap.block_state == 2)
    snap = _with(snap, EngineEvent(snap.step, snap.time, EV_PREFIX_HIT, "w0-1", (shared,)),
                 EngineEvent(snap.step, snap.time, EV_COW, "w0-2", (shared, 90)))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        kv = app.query_one(KVMap)
        rc = int(snap.block_refcount[shared])
        assert kv._fl[shared] == COW and kv.cell_text(shared) == ("+" if rc > 9 else str(rc))
        if len(cached):
            assert kv._cat[cached[0]] == CACHED and kv.cell_text(int(cached[0])) == CACHED_GLYPH
        assert f"{CACHED_GLYPH} cached" in widget_text(app.query_one(KVLegend))


@sync
async def test_evictions_do_not_flash_and_read_as_a_rate():
    snap = session_snapshot(12)
    blocks = tuple(range(40))
    snap = _with(snap, *(EngineEvent(snap.step, snap.time - 0.1 * i, EV_EVICT, None,
                                     blocks[4 * i:4 * i + 4]) for i in range(10)))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        assert not app.query_one(KVMap)._fl.any()          # no `E` wall on the map
        log = widget_text(app.query_one(EventLog))
        assert "40 cached blocks/s" in log                  # 40 blocks in the last second
        assert log.count("evict") == 1                      # one line, not one per event


@sync
async def test_ctrl_c_quits_cleanly():
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0 and not any("ctrl+q" in text for _, text in app.messages)


def test_an_engine_error_is_named_once():
    exc = InvalidRequestError("InvalidRequestError: num_blocks must be an integer >= 2")
    assert error_line(exc) == "InvalidRequestError: num_blocks must be an integer >= 2"
    assert error_line(ValueError("bad")) == "ValueError: bad"


UNUSABLE = [
    (["--num-blocks", "3"], "--num-blocks 3 holds 48 tokens"),
    (["--num-blocks", "0"], "num_blocks must be an integer >= 2"),
    (["--num-blocks", "8", "--input-len", "200"], "use --num-blocks 60 or more"),
    (["--num-blocks", "9"], "use --num-blocks 26 or more"),     # what 3's used to say
]


@pytest.mark.parametrize("argv,message", UNUSABLE, ids=[" ".join(a) for a, _ in UNUSABLE])
def test_an_unusable_pool_is_refused_before_the_app_opens(argv, message, capsys, monkeypatch):
    import roseplay.cli as cli
    monkeypatch.setattr(cli, "run_tui", lambda args: pytest.fail("the app started"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("roseplay: error:") and message in err
    assert "Error: " not in err


def test_cuda_without_cuda_is_refused_before_the_app_opens(capsys, monkeypatch):
    import torch

    import roseplay.cli as cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cli, "run_tui", lambda args: pytest.fail("the app started"))
    assert cli.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_default_pool_is_accepted(monkeypatch):
    import roseplay.cli as cli
    monkeypatch.setattr(cli, "run_tui", lambda args: 0)
    assert cli.main([]) == 0 and cli.main(["--num-blocks", "26"]) == 0



@sync
async def test_escape_brings_the_followed_request_back_into_view():
    from roseplay.tui.widgets.requests import ACTIVE, RequestList
    app = RoseplayApp(source=StaticSource(session_snapshot(12)))
    async with app.run_test(size=(120, 30)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        lst = app.query_one(RequestList)
        assert len(lst.rows) > lst._visible() and lst.rows[0].state in ACTIVE
        lst.select(lst.rows[-1].request_id)        # as a typed prompt, the newest row
        await pilot.pause()
        assert lst.top > 0
        lst.focus()
        await pilot.press("escape")
        await pilot.pause()
        assert lst.selected is None and lst.current is lst.rows[0]
        assert lst.top == 0 and lst.rows[0].request_id in widget_text(lst)


@sync
async def test_a_selected_request_keeps_its_row_after_the_snapshot_lets_it_go():
    """An ended request stays in snapshots only while it is among the latest few; the
    one the user selected keeps its row, as last seen, until it is unselected (live),
    and a replay's frames, which go back in time, never keep one."""
    from roseplay.tui.widgets.requests import ACTIVE, RequestList
    snap = session_snapshot(12)
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(120, 30)):
        lst = app.query_one(RequestList)
        views, budget = list(snap.requests), snap.knobs.max_num_batched_tokens
        live = next(r for r in views if r.state in ACTIVE)
        done = dataclasses.replace(live, state="finished")
        others = [r for r in views if r is not live]
        lst.show(views, budget)
        lst.select(live.request_id)
        lst.show(others, budget)                 # gone while active: its end is unknown
        assert lst.selected is None
        lst.select(live.request_id)
        for frame in ([*others, done], others, others):     # (no await: the app's own
            lst.show(frame, budget)                          # frames stay out of it)
            assert lst.current is done and done in lst.rows
        lst.show(others, budget, pin=False)      # a replay's frame
        assert lst.selected is None and done not in lst.rows
        lst.show([*others, done], budget)
        lst.select(done.request_id)
        lst.select(None)                         # unselected: let go at the next frame
        lst.show(others, budget)
        assert done not in lst.rows


@sync
async def test_time_series_for_a_tuner_with_a_mark_where_a_knob_changed():
    from roseplay.tui.widgets.timing import MARK_BG, Plot, TimeAxis
    snap = session_snapshot(12)
    source = StaticSource(snap)
    app = RoseplayApp(source=source)
    async with app.run_test(size=(200, 60)) as pilot:
        for i in range(12):                     # 6 s of engine time, a knob change at 3 s
            if i == 6:                          # (from before the requests' first tokens:
                app.mark_change("budget 32")    # the TTFT curve counts those after its start)
            source.snap = dataclasses.replace(snap, time=snap.time - 3.0 + 0.5 * i)
            app.timing._shown_at = (None, -1.0)
            app.refresh_panels()
            await pilot.pause()
        shown = {p.label: widget_text(p) for p in app.query(Plot) if p.display}
        # a static snapshot: no new token gaps or lookups, so ITL and hit rate say "-"
        assert set(shown) == {"TTFT", "ITL", "tok/s", "running", "waiting", "KV used",
                              "hit rate"}
        assert shown["ITL"].startswith("ITL -") and shown["hit rate"].startswith("hit rate -")
        assert re.match(r"TTFT [\d.]+ms/", shown["TTFT"])
        assert shown["running"].startswith(f"running {snap.last_step.num_running}/")
        kv = f"{100 * snap.num_used / snap.num_blocks:.0f}%"
        assert shown["KV used"].startswith(f"KV used {kv}/100%")
        assert "▲budget 32" in widget_text(app.query_one(TimeAxis))
        plot = app.query_one("#plot-kv", Plot)
        styles = [seg.style.bgcolor for seg in plot.render_line(0) if seg.style and seg.style.bgcolor]
        assert sum(str(c.name).lower() == MARK_BG for c in styles) == 1     # one marked column


@sync
async def test_nothing_is_cut_mid_word_at_120x40():
    from roseplay.tui.widgets.knobs import KnobsPanel
    from roseplay.tui.widgets.requests import progress_cell
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(12)
        app.refresh_panels()
        await pilot.pause()
        legend = widget_text(app.query_one(KVLegend)).splitlines()
        assert not legend[0].rstrip("│ ").endswith("…") and "cached" in legend[0]
        knobs = widget_text(app.query_one(KnobsPanel)).splitlines()[1:-1]
        rows = [line for line in knobs if "…" in line and "(? help)" not in line]
        assert not rows, rows
    snap = session_snapshot(12)
    view = dataclasses.replace(next(r for r in snap.requests if r.state == "decoding"),
                               state="prefilling", chunks_done=2, computed_tokens=64,
                               prefill_target=256)
    for width in (8, 11, 16, 30):   # the progress column at 80, 120 and 200 columns
        text = "".join(seg.text for seg in progress_cell(view, 32, width))
        assert len(text) == width and "2/8" in text and "…" not in text, text
    waiting = dataclasses.replace(view, state="waiting")
    text = "".join(seg.text for seg in progress_cell(waiting, 32, 11, "max_num_seqs 16 full"))
    assert text.strip() == "seqs full"
    # 80x24's 8 cells read "seqs fu…", "budget …", "next st…"
    for reason, short in (("max_num_seqs 16 full", "no seat"),
                          ("token budget used up", "budget"), ("no free KV block", "no block"),
                          ("needs 18 KV blocks, 6 free", "KV full"),
                          ("admitted at the next step", "up next")):
        text = "".join(seg.text for seg in progress_cell(waiting, 32, 8, reason))
        assert text.strip() == short and len(text) == 8, text


@sync
async def test_the_selected_request_shows_its_output_at_80x24():
    from roseplay.tui.widgets.request_detail import RequestDetail
    snap = session_snapshot(12)
    view = next(r for r in snap.requests if r.state == "decoding")
    view = dataclasses.replace(view, prompt_preview="a long system prompt " * 20,
                               text="GENERATED words stream here")
    snap = dataclasses.replace(snap, requests=(view,) + tuple(
        r for r in snap.requests if r.request_id != view.request_id))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=(80, 24)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        detail = widget_text(app.query_one(RequestDetail))
        assert "GENERATED words stream here" in detail and "a long system prompt" in detail


def test_a_quit_during_the_load_stops_only_this_processes_engine():
    import subprocess
    import sys

    from roseplay.tui.early_start import ENGINE_MODULE, stop_loading_engines
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              ENGINE_MODULE])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stop_loading_engines() == [child.pid]
        assert child.wait(10) != 0 and other.poll() is None
    finally:
        for p in (child, other):
            p.kill()
            p.wait()


@sync
async def test_a_replay_seek_keeps_the_plots_history():
    from roseplay.tui.widgets.timing import Plot
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        entries = app.source.recording.entries
        await pilot.press("G")                  # from the first frame to the last
        await pilot.pause()
        points = len(app.timing.history.series["tput"])
        # one point per 0.5 s of the recording up to the new position, not one point
        # bridging the jump (nor, after a seek back, a fresh start)
        assert points >= int((entries[-1].t - entries[0].t) / 0.75), points
        assert len(app.query_one("#plot-tput", Plot).values) == points


def test_a_tall_map_panel_uses_its_rows():
    # 512 blocks in the map of a 200x60 screen (85 columns, 31 rows): two columns per
    # block with a blank row between (25 rows), not the packed 13 rows
    assert KVMap.pick_mode(512, 85, 31)[::2] == ("tall", 25)
    assert KVMap.pick_mode(512, 85, 20)[0] == "digits"
    assert KVMap.pick_mode(96, 85, 31)[0] == "roomy"

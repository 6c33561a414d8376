"""Issue 18's new panels and keys on recorded data: the event log and the map's flashes,
windowed counters and reset, sort/filter, zoom, replay seek/speed, theme, the palette."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.codes import EV_CHUNK_DONE, EV_COW, EV_PREEMPT
from engine.snapshot import EngineCounters, EngineEvent
from roseplay.tui.app import RoseplayApp
from roseplay.workload.frames import FrameDecoder, FrameEncoder
from roseplay.workload.record import header_for
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.counters import CounterWindow
from roseplay.tui.widgets.events import EventLog
from roseplay.tui.widgets.kv_map import COW, PREEMPTED, SELECTED, KVMap, styles
from roseplay.tui.widgets.kv_panel import KVLegend
from roseplay.tui.widgets.requests import ACTIVE, RequestList, arrange, seat_reasons, waiting_reason
from tests.roseplay.tui.helpers import (SESSION, SIZE, StaticSource, notices, palette_query,
                                        screen_text, session_snapshot, sync, wait_for,
                                        widget_text)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _default_theme():
    yield
    theme.set_theme("default")


def _with_events(snap):
    """Frame 12 of the session plus a COW of shared block 0 into 40 by w0-28 and the
    preemption of w0-31 (its blocks freed), both at the snapshot's time."""
    preempted = snap.request("w0-31").blocks
    events = (EngineEvent(snap.step - 1, snap.time - 0.01, EV_CHUNK_DONE, "w0-30", (31,), "96/96"),
              EngineEvent(snap.step - 1, snap.time, EV_COW, "w0-28", (0, 40)),
              EngineEvent(snap.step - 1, snap.time, EV_PREEMPT, "w0-31", preempted))
    return dataclasses.replace(snap, events=events), preempted


@sync
async def test_cow_and_preemption_show_in_the_log_and_flash_on_the_map():
    snap, preempted = _with_events(session_snapshot(12))
    app = RoseplayApp(source=StaticSource(snap))
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_panels()
        await pilot.pause()
        log = widget_text(app.query_one(EventLog)).splitlines()
        assert "P preempt" in log[1] and "w0-31" in log[1] and f"freed {len(preempted)}" in log[1]
        assert "C COW" in log[2] and "w0-28" in log[2] and "0→40" in log[2]    # newest first
        assert "chunk done" in log[3] and "96/96" in log[3]
        kv = app.query_one(KVMap)
        assert kv._fl[0] == kv._fl[40] == COW
        assert all(kv._fl[b] == PREEMPTED for b in preempted)
        # the flash marks the cell; a refcount digit (shared block 0) stays readable
        rc = int(snap.block_refcount[0])
        assert kv.cell_text(0) == (str(rc) if 1 < rc <= 9 else "+" if rc > 9 else "C")
        assert "P" in widget_text(kv)


@sync
async def test_flashes_end_when_engine_time_moves_on():
    snap, _ = _with_events(session_snapshot(12))
    later = dataclasses.replace(snap, time=snap.time + 5.0)
    source = StaticSource(snap)
    app = RoseplayApp(source=source)
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_panels()
        source.snap = later
        app.refresh_panels()
        await pilot.pause()
        fl = app.query_one(KVMap)._fl
        assert COW not in fl and PREEMPTED not in fl
        assert "C COW" in widget_text(app.query_one(EventLog))     # the log keeps them


def test_events_survive_a_recording_round_trip():
    snap = session_snapshot(12)
    later = _with_events(snap)[0]
    with_events = [snap, later, dataclasses.replace(later, time=later.time + 0.1)]
    enc, dec = FrameEncoder(), FrameDecoder(header_for(snap))
    frames = [enc.encode(s, i * 0.1, {}) for i, s in enumerate(with_events)]
    assert "ev" not in frames[0] and len(frames[1]["ev"]) == 3
    assert "ev" not in frames[2]          # the same events: nothing new is written
    decoded = [dec.decode(f)[0] for f in frames]
    assert decoded[1].events == with_events[1].events == decoded[2].events


def _counters(**kw):
    return EngineCounters(**kw)


class _Snap:
    num_used = 0
    requests = ()      # (the window keeps the finished ones it sees: none here)
    recent_itls = recent_steps = ()     # (and the token gaps and steps: none either)

    def __init__(self, t, **counters):
        self.time, self.counters = t, _counters(**counters)


def test_windowed_hit_rate_drops_while_the_total_remembers_and_reset_restarts():
    w = CounterWindow(window=10.0)
    w.feed(_Snap(0.0, steps=1))
    w.feed(_Snap(5.0, steps=50, prefix_queried_tokens=1000, prefix_hit_tokens=900))
    assert w.hit_rate(recent=True) == w.hit_rate(recent=False) == 0.9
    # the cache is turned off at t=5: 1000 more tokens looked up... none hit
    w.feed(_Snap(16.0, steps=100, prefix_queried_tokens=2000, prefix_hit_tokens=900,
                 evictions=7))
    assert w.hit_rate(recent=True) == 0.0 and w.hit_rate(recent=False) == 0.45
    assert w.recent("evictions") == w.total("evictions") == 7
    w.reset()
    w.feed(_Snap(17.0, steps=110, prefix_queried_tokens=2000, prefix_hit_tokens=900,
                 evictions=9))
    assert w.total("evictions") == 2 and w.hit_rate(recent=False) is None


@sync
async def test_reset_key_restarts_the_totals_on_screen():
    src = ReplaySource(SESSION, start_paused=True)
    app = RoseplayApp(source=src)
    async with app.run_test(size=SIZE) as pilot:
        src.seek(30)
        app.refresh_panels()
        await pilot.pause()
        legend = widget_text(app.query_one(KVLegend))
        assert "total" in legend and "evicted 0 " not in legend.split("total")[1]
        await pilot.press("0")
        await pilot.press("n")
        legend = widget_text(app.query_one(KVLegend))
        assert "since reset" in legend  # (160 columns: the long labels)
        assert "stats reset" in notices(app)


def test_waiting_reason_names_what_holds_the_queue():
    snap = session_snapshot(12)           # 8 running, budget 64, last step used 8 tokens
    full = dataclasses.replace(snap, knobs=snap.knobs.replace(max_num_seqs=8))
    assert waiting_reason(full) == "max_num_seqs 8 full"
    tight = dataclasses.replace(snap, knobs=snap.knobs.replace(max_num_batched_tokens=8))
    assert waiting_reason(tight) == "token budget used up"
    no_blocks = dataclasses.replace(snap, block_state=np.ones_like(snap.block_state))
    assert waiting_reason(no_blocks) == "no free KV block"
    assert waiting_reason(snap) == "admitted at the next step"


def test_a_pool_too_full_for_any_queued_chunk_is_the_reason_they_wait():
    """A full pool with 6 cached blocks left: no queued request's next chunk fits, so none
    is admitted (it read "admitted at the next step" for 17 s, guide 3 with swap)."""
    snap = session_snapshot(12)
    snap = dataclasses.replace(snap, knobs=snap.knobs.replace(max_num_batched_tokens=512))
    state = np.ones_like(snap.block_state)
    state[:6] = 2                                       # 6 cached (evictable), no free
    queued = dataclasses.replace(snap.requests[0], request_id="w-queued", state="waiting",
                                 prompt_tokens=300, computed_tokens=0, output_tokens=0)
    reqs = snap.requests + (queued,)
    budget = snap.knobs.max_num_batched_tokens
    need = -(-min(300, budget) // snap.block_size)
    full = dataclasses.replace(snap, block_state=state, requests=reqs)
    assert need > 6 and waiting_reason(full) == f"needs {need} KV blocks, 6 free"
    roomy = dataclasses.replace(full, knobs=snap.knobs.replace(max_num_batched_tokens=16))
    assert waiting_reason(roomy) == "admitted at the next step"     # a 1-block chunk fits


@pytest.mark.parametrize("policy, admitted", [("fcfs", {"q0", "pre"}),
                                               ("priority", {"q1", "q2"}),
                                               ("lpm", {"q0", "q1", "q2", "pre"})])
def test_only_the_queued_requests_the_free_seats_take_are_admitted_next(policy, admitted):
    """10 of 12 seats taken: the two first in admission order are admitted at the next
    step, the rest wait for a seat (all read "admitted at the next step"); lpm's order is
    the engine's to know: its rows keep the one reason."""
    snap = session_snapshot(12)           # 8 decoding, budget 64, last step 8 tokens
    base = snap.requests[0]
    t = base.arrival_time
    running = tuple(dataclasses.replace(base, request_id=f"r{i}") for i in range(2))
    queued = tuple(dataclasses.replace(base, request_id=f"q{i}", state="waiting", priority=p,
                                       arrival_time=t + 1 + i, output_tokens=0,
                                       computed_tokens=0) for i, p in enumerate((1, 0, 0)))
    pre = dataclasses.replace(base, request_id="pre", state="preempted", priority=1,
                              arrival_time=t + 5, preemptions=1, output_tokens=0,
                              computed_tokens=0)
    snap = dataclasses.replace(snap, requests=snap.requests + running + queued + (pre,),
                               knobs=snap.knobs.replace(max_num_seqs=12,
                                                        scheduling_policy=policy))
    reason = waiting_reason(snap)
    assert reason == "admitted at the next step"
    left = seat_reasons(snap, reason)
    assert {"q0", "q1", "q2", "pre"} - set(left) == admitted
    assert set(left.values()) <= {"max_num_seqs 12 full"}
    assert seat_reasons(snap, "token budget used up") == {}


def test_sort_and_filter_of_the_request_list():
    reqs = session_snapshot(12).requests
    active = arrange(reqs, state="active")
    assert active and all(r.state in ACTIVE for r in active)
    assert all(r.state == "finished" for r in arrange(reqs, state="finished"))
    by_ttft = [r.ttft or 0.0 for r in arrange(reqs, "TTFT")]
    assert by_ttft == sorted(by_ttft, reverse=True)


@sync
async def test_sort_filter_keys_and_the_list_says_so():
    src = ReplaySource(SESSION, start_paused=True)
    app = RoseplayApp(source=src)
    async with app.run_test(size=SIZE) as pilot:
        src.seek(12)
        await pilot.press("f", "f")         # all -> active -> waiting
        lst = app.query_one(RequestList)
        assert lst.state_filter == "waiting" and lst.rows == []
        assert "no waiting request" in widget_text(lst)
        await pilot.press("F", "o", "o", "o")     # active; sort: state, TTFT, TPOT
        assert lst.state_filter == "active" and lst.sort == "TPOT"
        assert "sorted by TPOT · only active" in widget_text(lst)
        tpots = [r.tpot for r in lst.rows]
        assert tpots == sorted(tpots, reverse=True)


@sync
async def test_replay_seek_speed_start_and_end_keys():
    src = ReplaySource(SESSION, start_paused=True)
    app = RoseplayApp(source=src)
    async with app.run_test(size=SIZE) as pilot:
        t0 = src.recording.entries[0].t
        await pilot.press("right")
        assert src.recording.entries[src.index].t <= t0 + 5 < src.recording.entries[
            min(src.index + 1, len(src.recording) - 1)].t or src.index == len(src.recording) - 1
        await pilot.press("G")
        assert src.index == len(src.recording) - 1
        await pilot.press("left")
        assert src.recording.entries[src.index].t <= src.recording.entries[-1].t - 4
        await pilot.press("g")
        assert src.index == 0
        await pilot.press("v", "v")
        assert src.speed == 4.0 and "×4" in screen_text(app)
        await pilot.press("V")
        assert src.speed == 2.0


@sync
async def test_zoom_cycles_panels_and_back():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=(80, 24)) as pilot:
        app.refresh_panels()
        assert "hidden at 80×24: This step, Steps, Events, timing plots" in screen_text(app)
        await pilot.press("z")
        assert app.zoom == "kv" and "zoom: KV cache" in screen_text(app)
        assert not app.query_one("#right").display
        await pilot.press("z", "z", "z")
        assert app.zoom == "timing"
        plot = app.query_one("#plot-ttft")
        await pilot.pause()
        assert plot.display and plot.points() >= 40        # plots have room when zoomed
        await pilot.press("Z")
        assert app.zoom is None and "hidden at 80×24" in screen_text(app)


@sync
async def test_colour_blind_theme_recolours_the_map():
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_panels()
        before = styles()["colors"][SELECTED]
        await pilot.press("t")
        assert theme.current() == "colour-blind"
        assert styles()["colors"][SELECTED] == "#f0e442" != before
        await pilot.press("t")
        assert theme.current() == "default"


@sync
async def test_command_palette_runs_actions_by_name():
    src = ReplaySource(SESSION, start_paused=True)
    app = RoseplayApp(source=src)
    async with app.run_test(size=SIZE) as pilot:
        await palette_query(pilot, app, "zoom timing")
        assert await wait_for(pilot, lambda: "zoom Timing" in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.zoom == "timing", 30)
        await palette_query(pilot, app, "speed 8")
        assert await wait_for(pilot, lambda: "replay speed 8" in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: src.speed == 8.0, 30)


@pytest.mark.slow
@sync
async def test_random_keys_and_resizes_never_break_the_app(monkeypatch):
    """150 seeded key presses (palette, help, prompt, zoom, theme, seek …) and resizes on a
    replay: the app keeps drawing a full screen (a crash would end run_test with it)."""
    from tests.roseplay.tui.helpers import fast_idle, press_at_random
    fast_idle(monkeypatch)
    keys = list("nbcxsSrRoOfFzZ0t+-[]<>gGvV?") + [
        "space", "left", "right", "up", "down", "escape", "enter", "ctrl+p", "i", "a",
        "pagedown"]
    app = RoseplayApp(source=ReplaySource(SESSION))
    async with app.run_test(size=(80, 24)) as pilot:
        await press_at_random(pilot, app, keys, presses=150, seed=18, resize_every=25,
                              sizes=[(80, 24), (120, 40), (200, 60), (60, 20)])

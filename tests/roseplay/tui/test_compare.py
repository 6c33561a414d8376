"""`roseplay --compare`: one workload stream for two engines, the side-by-side screen,
its controls (both sides but the compared knob), and record/replay of both sides."""
from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest

from engine.config import InvalidRequestError
from roseplay.tui.compare import (CompareReplaySource, is_compare_recording, pair_path,
                                  parse_compare, start_compare)
from roseplay.tui.compare_app import CompareApp
from roseplay.workload.driver import WorkloadDriver
from roseplay.workload.shared import SharedWorkload
from roseplay.workload.source import ReadOnlyError
from tests.roseplay.tui.helpers import (DATA, ENGINE, fast_idle, notices, press_at_random, screen_text, sync,
                                        wait_for)

pytestmark = pytest.mark.timeout(120)
COMPARE_SESSION = f"{DATA}/compare_session.jsonl.gz"


# -- one workload stream ---------------------------------------------------------------------
def test_readers_get_the_same_items_whatever_their_pace():
    w = SharedWorkload("shared-prefix", seed=3, input_len=32, output_len=8, vocab_size=100)
    fast, slow = w.reader(), w.reader()
    got_fast = [next(fast) for _ in range(6)]
    w.set_rate(20.0)                       # from the leader's next item (6) on, for both
    got_fast += [next(fast) for _ in range(6)]
    got_slow = [next(slow) for _ in range(4)]
    w.set_scenario("random")               # from item 12 on
    got_fast += [next(fast) for _ in range(4)]
    got_slow += [next(slow) for _ in range(12)]
    assert got_slow == got_fast
    assert [x.arrival is None for x in got_fast] == [True] * 6 + [False] * 10
    arrivals = [x.arrival for x in got_fast[6:12]]
    assert arrivals == sorted(arrivals)    # Poisson offsets, increasing within a segment
    assert [x.tag for x in got_fast[12:]] == ["random"] * 4
    assert len(w._segments) == 1           # both readers passed the old segments


def test_a_rate_change_keeps_the_scenario_going():
    w = SharedWorkload("shared-prefix", seed=0, input_len=32, output_len=8, vocab_size=100)
    r = w.reader()
    first = [next(r).tag for _ in range(3)]
    w.set_rate(5.0)
    assert first + [next(r).tag for _ in range(3)] == [f"prefix-{i % 4}" for i in range(6)]


class FakeLoop:
    """Records submissions (time, id, prompt); a request finishes `delay` s later."""

    def __init__(self, delay: float):
        self.delay, self.log = delay, []

    def submit(self, prompt, params, request_id, on_finish, priority=0):
        self.log.append((time.perf_counter(), request_id, prompt))
        done = SimpleNamespace(request_id=request_id, output=None, error="fake")
        threading.Timer(self.delay, on_finish, args=(done,)).start()
        return SimpleNamespace(request_id=request_id, cancel=lambda: None)


@pytest.mark.parametrize("rate,concurrency", [(40.0, None), (None, 2)],
                         ids=["open-loop", "closed-loop"])
def test_two_drivers_send_the_same_prompts_in_the_same_order(rate, concurrency):
    w = SharedWorkload("long-short", rate=rate, seed=1, input_len=24, output_len=4,
                       vocab_size=100)
    loops = [FakeLoop(0.005), FakeLoop(0.05)]          # a fast and a slow engine
    drivers = [WorkloadDriver(loop, w.reader(), concurrency=concurrency, num_requests=12,
                              id_prefix="c-", epoch=w.epoch) for loop in loops]
    for d in drivers:
        d.start()
    assert all(d.wait(20) for d in drivers)
    a, b = (loop.log for loop in loops)
    assert [(rid, p) for _, rid, p in a] == [(rid, p) for _, rid, p in b]
    assert len(a) == 12 and len({str(p) for _, _, p in a}) > 1
    if rate:        # open loop: every request reaches both engines at its arrival time;
        # a driver held up by the slow engine's 50 ms requests falls further behind with
        # each of the 12 arrivals; 0.15 s leaves room for thread wake-ups on a busy box
        assert max(abs(x[0] - y[0]) for x, y in zip(a, b)) < 0.15
    else:           # closed loop: a request goes out when one of the 2 in flight ends,
        # so at least the slow engine's 50 ms after the earlier of them went out (a lower
        # bound that load cannot break, where a gap between the two drivers' last sends
        # read 0.09 s against 0.1 on a busy box)
        assert all(b[k + 2][0] - b[k][0] >= 0.045 for k in range(len(b) - 2))


def test_parse_compare():
    assert parse_compare("max-num-batched-tokens=256,2048") == ("max_num_batched_tokens",
                                                               [256, 2048])
    assert parse_compare("enable_prefix_caching=true,false") == ("enable_prefix_caching",
                                                                [True, False])
    assert parse_compare("num_blocks=64,128") == ("num_blocks", [64, 128])   # a start-time knob
    for bad in ("max_num_seqs=4", "max_num_seqs=4,8,16", "nope=1,2", "max_num_seqs=8,8",
                "max_num_seqs=0,8", "max_num_seqs"):
        with pytest.raises(ValueError):
            parse_compare(bad)
    assert pair_path("/x/run.jsonl.gz") == "/x/run.B.jsonl.gz" and pair_path("r") == "r.B"


def test_cli_refuses_bad_compare_and_goodput_flags(capsys):
    from roseplay.cli import main
    for argv in (["--compare", "nope=1,2"], ["--compare", "max_num_seqs=8"],
                 ["--compare", "max_num_seqs=8,16", "--connect", "tcp://127.0.0.1:1"],
                 ["--goodput", "ttft:x"], ["--goodput", "itl:5"]):
        try:
            code = main(argv)
        except SystemExit as exc:        # argparse's own errors
            code = exc.code
        assert code == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("roseplay: error:"), (argv, err)


# -- live: two in-process engines ------------------------------------------------------------
def _compare(knob="enable_prefix_caching", values=(True, False), **kw):
    opts = dict(scenario="shared-prefix", concurrency=4, rate=None, input_len=48,
                output_len=16, temperature=0.0, in_process=True)
    opts.update(kw)
    return start_compare(dict(ENGINE), knob, list(values), **opts)


def test_both_engines_serve_the_same_prompts():
    src = _compare()
    try:
        deadline = time.monotonic() + 30
        while min(s.driver.completed for s in src.sides) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        outs = [{o.request_id: o for o in s.driver.outputs} for s in src.sides]
        common = sorted(set(outs[0]) & set(outs[1]), key=lambda r: int(r.split("-")[1]))
        assert len(common) >= 8
        for rid in common:      # the same prompt, and greedy: the same tokens
            a, b = outs[0][rid], outs[1][rid]
            assert a.prompt_token_ids == b.prompt_token_ids
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
        hit = [s.snapshot().counters.prefix_hit_tokens for s in src.sides]
        assert hit[0] > 0 and hit[1] == 0          # the compared knob: on vs off
    finally:
        src.close()


@pytest.mark.slow
def test_engine_processes_load_at_once_and_both_serve(monkeypatch):
    """--compare spawns both engine processes before waiting for either (they load in
    parallel), then each client takes its process over; both serve; close stops both."""
    from engine.front.client import EngineClient
    from engine.ipc.launch import EngineLaunch
    order = []
    real_launch, real_client = EngineLaunch.__init__, EngineClient.__init__
    monkeypatch.setattr(EngineLaunch, "__init__", lambda self, *a, **k: (
        order.append("spawn"), real_launch(self, *a, **k))[1])
    monkeypatch.setattr(EngineClient, "__init__", lambda self, *a, **k: (
        order.append("client"), real_client(self, *a, **k))[1])
    src = _compare(in_process=False)
    procs = [s.loop.proc for s in src.sides]
    try:
        assert order == ["spawn", "spawn", "client", "client"]
        deadline = time.monotonic() + 30
        while min(s.driver.completed for s in src.sides) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert min(s.driver.completed for s in src.sides) >= 2
    finally:
        src.close()
    assert all(p.poll() is not None for p in procs)


@pytest.mark.slow
@pytest.mark.timeout(600)      # four engine processes start on two shared cores
def test_each_side_is_a_data_parallel_front_with_data_parallel_size():
    """--compare with --data-parallel-size 2: each side is a router over two engine
    processes (not one engine), both sides serve, and both replicas of each do."""
    from engine.front.dp_client import DPClient
    src = start_compare(dict(ENGINE, data_parallel_size=2, routing_policy="round_robin"),
                        "enable_prefix_caching", [True, False], scenario="random",
                        concurrency=4, rate=None, input_len=16, output_len=4,
                        temperature=0.0, in_process=False)
    try:
        assert all(isinstance(s.loop, DPClient) and s.loop.size == 2 for s in src.sides)
        deadline = time.monotonic() + 60
        while min(s.driver.completed for s in src.sides) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(min(s.loop.router.routed) >= 1 for s in src.sides)
        assert min(s.driver.completed for s in src.sides) >= 4
    finally:
        src.close()


@sync
async def test_compare_screen_keys_change_both_sides_but_the_compared_knob(monkeypatch):
    fast_idle(monkeypatch)
    src = _compare("max_num_batched_tokens", (64, 512))
    app = CompareApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: min(s.snapshot().counters.finished
                                                 for s in src.sides) >= 2)
        await pilot.press("c")                          # prefix cache off: both sides
        await pilot.press("right_square_bracket")       # max_num_seqs up: both sides
        await pilot.press("minus")                      # the compared knob: refused
        await pilot.pause(0.2)
        knobs = [s.knobs for s in src.sides]
        assert [k.enable_prefix_caching for k in knobs] == [False, False]
        assert [k.max_num_seqs for k in knobs] == [72, 72]
        assert [k.max_num_batched_tokens for k in knobs] == [64, 512]
        assert "is what this view compares" in notices(app)
        app.refresh_panels()
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "A · max_num_batched_tokens=64" in text and "B · max_num_batched_tokens=512" in text
        assert "keys change both sides, not max_num_batched_tokens" in text
        assert "B/A" in text and "×" in text
        with pytest.raises(InvalidRequestError):
            src.set_knobs(max_num_seqs=0)               # refused before either side changes
        assert [s.knobs.max_num_seqs for s in src.sides] == [72, 72]
        await pilot.press("question_mark", "1")         # guide 1 on both sides: a clean
        assert await wait_for(pilot, lambda: [s.knobs.max_num_seqs for s in src.sides]
                              == [16, 16], 10)          # default (the app's max_num_seqs)
        #                                                 but the compared knob
        assert [k.enable_prefix_caching for k in (s.knobs for s in src.sides)] == [True, True]
        assert [s.knobs.max_num_batched_tokens for s in src.sides] == [64, 512]
        assert src.workload()["scenario"] == "mixed"
        assert await wait_for(pilot, lambda: "skipped max_num_batched_tokens" in notices(app), 30)
        await pilot.press("q")


# -- record / replay -------------------------------------------------------------------------
def test_record_keeps_both_sides(tmp_path):
    path = str(tmp_path / "cmp.jsonl.gz")
    src = _compare(record=path)
    a_hits = lambda: src.sides[0].snapshot().counters.prefix_hit_tokens > 0   # noqa: E731
    deadline = time.monotonic() + 30
    while not a_hits():                     # side A has served a cached prefix ...
        assert time.monotonic() < deadline, "side A never hit its prefix cache"
        time.sleep(0.05)
    frames = [side.recorder.frames for side in src.sides]
    while any(side.recorder.frames < n + 2 for side, n in zip(src.sides, frames)):
        assert time.monotonic() < deadline, "the recorders stopped"   # ... and both
        time.sleep(0.05)                    # recorders wrote frames after that
    src.close()
    assert is_compare_recording(path) and is_compare_recording(pair_path(path))
    replay = CompareReplaySource(pair_path(path), start_paused=True)   # either file opens both
    assert replay.labels() == ["A · enable_prefix_caching=on", "B · enable_prefix_caching=off"]
    replay.seek(len(replay.recording) - 1)
    a, b = replay.snapshots()
    assert a.knobs.enable_prefix_caching and not b.knobs.enable_prefix_caching
    assert a.counters.prefix_hit_tokens > 0 and b.counters.prefix_hit_tokens == 0


@sync
async def test_compare_replay_steps_both_sides():
    src = CompareReplaySource(COMPARE_SESSION, start_paused=True)
    app = CompareApp(source=src)
    async with app.run_test(size=(120, 40)) as pilot:
        app.refresh_panels()
        steps0 = [s.step for s in src.snapshots()]
        for _ in range(9):          # the n key's action (each frame drawn costs ~0.1 CPU-s)
            app.action_step()
        await pilot.press("n")      # and the key
        steps1 = [s.step for s in src.snapshots()]
        assert all(b > a for a, b in zip(steps0, steps1))     # both sides moved on
        await pilot.press("c")              # a live-only key: does nothing in a replay
        await pilot.pause(0.1)
        assert [s.knobs.enable_prefix_caching for s in src.snapshots()] == [True, False]
        with pytest.raises(ReadOnlyError):
            src.set_knobs(max_num_seqs=8)
        assert "recorded: both sides replay on one clock" in screen_text(app)


@sync
async def test_compare_screen_at_80x24_says_what_it_hid():
    app = CompareApp(source=CompareReplaySource(COMPARE_SESSION, start_paused=True))
    async with app.run_test(size=(80, 24)) as pilot:
        app.refresh_panels()
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "hidden at 80×24: timing panels" in text
        assert "B/A" in text and "TTFT p50" in text and "KV" in text
        assert "compare enable_prefix_caching: A on · B off" in text


@sync
async def test_each_sides_timing_tok_s_is_the_tables():
    """A side's Timing line and the B / A table read one output tok/s (the counters'
    10 s window): the Timing line read the last 2 s and disagreed with the table."""
    import re

    from roseplay.tui.widgets.ratios import RatioTable
    from roseplay.tui.widgets.timing import TimingStats
    from tests.roseplay.tui.helpers import widget_text
    app = CompareApp(source=CompareReplaySource(COMPARE_SESSION, start_paused=True))
    async with app.run_test(size=(200, 60)) as pilot:
        for _ in range(40):         # past the first frames: both windows span seconds
            app.action_step()
        app.refresh_panels()
        await pilot.pause(0.1)
        table = [line.strip("│ ").split() for line in
                 widget_text(app.query_one(RatioTable)).splitlines()]
        rows = {cells[0]: cells for cells in table if cells[:1] in (["A"], ["B"])}
        for i, side in enumerate("AB"):
            stats = widget_text(app.timings[i].query_one(TimingStats))
            rate = re.search(r"([\d,]+) tok/s", stats).group(1)
            assert rate == rows[side][3], (side, stats, table)    # TTFT, TPOT, then tok/s


@sync
async def test_a_running_sides_timing_and_the_table_read_one_frame():
    """While it runs, the table redrew every frame and the Timing panels every 0.5 s: a
    side's TTFT p50 read 1841ms above, 1844ms in the table (tok/s 614 and 611). Both are
    drawn from one frame now, every 0.5 s."""
    import re

    from roseplay.tui.widgets.ratios import RatioTable
    from roseplay.tui.widgets.timing import TimingStats
    from tests.roseplay.tui.helpers import widget_text

    class Running(CompareReplaySource):      # its frames move only when the test seeks
        paused = property(lambda self: False)
    src = Running(COMPARE_SESSION, start_paused=True)
    app = CompareApp(source=src)
    async with app.run_test(size=(200, 60)):
        for frame in range(10, 40):
            src.seek(frame)
            app.refresh_panels()
            table = [line.strip("│ ").split() for line in
                     widget_text(app.query_one(RatioTable)).splitlines()]
            rows = {cells[0]: cells for cells in table if cells[:1] in (["A"], ["B"])}
            for i, side in enumerate("AB"):
                stats = widget_text(app.timings[i].query_one(TimingStats))
                ttft = re.search(r"TTFT +(\S+)", stats).group(1)
                rate = re.search(r"(\S+) tok/s", stats).group(1)
                assert (ttft, rate) == (rows[side][1], rows[side][3]), (frame, side, stats,
                                                                          table)


def test_ratio_table_numbers_and_colours():
    from roseplay.tui.widgets.counters import CounterWindow
    from roseplay.tui.widgets.ratios import METRICS, _ratio_style, ratio, side_metrics
    from tests.roseplay.tui.helpers import session_snapshot
    window = CounterWindow()
    first, last = session_snapshot(5), session_snapshot(25)
    window.feed(first)
    window.feed(last)
    m = side_metrics(last, window, {"ttft": 1e9})
    made = last.counters.generated_tokens - first.counters.generated_tokens
    assert m["tput"] == pytest.approx(made / (last.time - first.time))
    assert m["goodput"] == 1.0 and m["kv_used"] == last.num_used
    assert set(m) == {x.key for x in METRICS}
    # under "B / A · last 10 s": the blocks in use are now's, and the column says so
    assert m["kv_used"] == last.num_used and METRICS[[x.key for x in METRICS].index(
        "kv_used")].title == "KV now"
    assert ratio(2.0, 1.0) == 2.0 and ratio(0, 0) == 1.0 and math.isnan(ratio(math.nan, 1.0))
    assert "#ff6b6b" in _ratio_style(2.0, higher_is_better=False)     # TTFT doubled: worse
    assert "#4cc97a" in _ratio_style(2.0, higher_is_better=True)      # tok/s doubled: better
    assert _ratio_style(1.02, True) == "dim"


def test_the_table_reads_a_hit_rate_of_0_with_the_cache_off():
    """Side B with the cache off read `-` for its hit rate (and its B/A `-`), where the
    side's hit plot reads 0 and its KV legend `off`: no prompt token is reused."""
    import dataclasses

    from roseplay.tui.widgets.counters import CounterWindow
    from roseplay.tui.widgets.ratios import side_metrics
    from tests.roseplay.tui.helpers import session_snapshot
    first, last = session_snapshot(5), session_snapshot(25)
    off = [dataclasses.replace(s, knobs=s.knobs.replace(enable_prefix_caching=False),
                               counters=dataclasses.replace(
                                   s.counters, prefix_hit_tokens=0, prefix_queried_tokens=0))
           for s in (first, last)]
    window = CounterWindow()
    for snap in off:
        window.feed(snap)
    assert side_metrics(off[1], window, {})["hit"] == 0.0


def test_replay_flag_opens_a_compare_recording_side_by_side():
    import argparse
    from roseplay.tui.app import RoseplayApp
    from roseplay.tui.launch import replay_app
    from tests.roseplay.tui.helpers import SESSION
    args = argparse.Namespace(replay=COMPARE_SESSION, replay_speed=1.0, paused=True)
    assert isinstance(replay_app(args, {}), CompareApp)
    args.replay = SESSION
    app = replay_app(args, {"ttft": 100.0})
    assert type(app) is RoseplayApp and app.slos == {"ttft": 100.0}


@pytest.mark.slow
@sync
async def test_random_keys_and_resizes_never_break_the_compare_screen(monkeypatch):
    fast_idle(monkeypatch)
    keys = list("nbcxsrRoOzZ0t+-[]<>gGvVl?19") + ["space", "left", "right", "escape",
                                                   "enter", "ctrl+p", "i", "down"]
    app = CompareApp(source=CompareReplaySource(COMPARE_SESSION))
    async with app.run_test(size=(80, 24)) as pilot:
        await press_at_random(pilot, app, keys, presses=80, seed=7, resize_every=20,
                              sizes=[(80, 24), (120, 40), (60, 20)])

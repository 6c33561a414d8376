"""Record/replay: lossless round trip, the file format, and replay in the app without torch."""
from __future__ import annotations

import dataclasses
import errno
import io
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.workload.frames import FrameDecoder, FrameEncoder
from roseplay.workload.record import header_for
from roseplay.workload.replay import load_recording
from roseplay.workload.source import ReadOnlyError, ReplaySource
from roseplay.tui.widgets.status import StatusBar
from tests.roseplay.tui.helpers import SESSION, SIZE, live_source, sync, wait_for, widget_text

pytestmark = pytest.mark.timeout(120)


def _same(a, b) -> None:
    """Two snapshots are equal field by field (arrays by value)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def test_encoder_decoder_round_trip_is_lossless():
    src = live_source(concurrency=6, scenario="identical")
    try:
        snaps, seen = [], None
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            s = src.snapshot()
            if s is not seen:
                snaps.append(s)
                seen = s
            time.sleep(0.03)
        src.set_knobs(enable_prefix_caching=False, max_num_batched_tokens=32)
        deadline = time.monotonic() + 30         # the next step applies them (loaded: later)
        while src.snapshot().knobs.enable_prefix_caching and time.monotonic() < deadline:
            time.sleep(0.05)
        snaps.append(src.snapshot())
    finally:
        src.close()
    assert len(snaps) > 5 and snaps[-1].counters.finished > 0
    enc, dec = FrameEncoder(keyframe_every=4), FrameDecoder(header_for(snaps[0]))
    keys = 0
    for i, s in enumerate(snaps):
        frame = enc.encode(s, i * 0.1, {"scenario": "identical"})
        keys += bool(frame.get("key"))
        back, workload = dec.decode(frame)
        _same(s, back)
        assert workload == {"scenario": "identical"}
    assert keys == -(-len(snaps) // 4)      # a keyframe every 4th frame, decoded the same
    assert snaps[-1].knobs.enable_prefix_caching is False


def test_recorder_writes_header_frames_and_events(tmp_path):
    path = str(tmp_path / "s.jsonl.gz")
    src = live_source(record=path)
    try:
        poll(lambda: src.recorder.frames >= 3)          # frames of the running engine
        src.set_knobs(enable_prefix_caching=False)
        src.set_scenario("random")
        src.pause()
        after = src.recorder.frames
        poll(lambda: src.recorder.frames >= after + 2)  # frames taken after the changes
    finally:
        src.close()
    rec = load_recording(path)
    assert rec.header["model"] == "dummy:tiny" and rec.header["num_blocks"] == 96
    assert len(rec) >= 5 and rec.describe_end() is None
    events = [e["what"] for e in rec.entries for e in e.events]
    assert events[:3] == ["knobs", "scenario", "pause"]
    assert rec[-1].snapshot.knobs.enable_prefix_caching is False
    assert rec[-1].workload["scenario"] == "random"
    assert all(b.t >= a.t for a, b in zip(rec.entries, rec.entries[1:]))


def test_committed_session_loads():
    rec = load_recording(SESSION)        # format 1 (before keyframes): still readable
    assert rec.header["model"] == "dummy:tiny" and len(rec) > 20
    steps = [rec[i].snapshot.step for i in range(len(rec))]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    assert [rec[i].snapshot.step for i in (30, 3, 31)] == [steps[30], steps[3], steps[31]]


@sync
async def test_replay_pause_step_and_back_on_its_timeline():
    src = ReplaySource(SESSION, start_paused=True)
    app = RoseplayApp(source=src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n", "n", "n")
        assert src.index == 3
        await pilot.press("b")
        assert src.index == 2
        assert app.snapshot is src.recording[2].snapshot
        assert f"frame 3/{len(src.recording)}" in widget_text(app.query_one(StatusBar))
        assert f"step {src.recording[2].snapshot.step}" in widget_text(app.query_one(StatusBar))
        await pilot.press("c")           # read-only: a warning, nothing breaks
        with pytest.raises(ReadOnlyError):
            src.set_knobs(enable_prefix_caching=False)
        await pilot.press("space")
        assert not src.paused
        assert await wait_for(pilot, lambda: src.index > 6, 30)
        await pilot.press("space")
        idx = src.index
        await pilot.pause(0.4)
        assert src.index == idx


# one child for both checks: `roseplay --replay` built through the CLI (the app's run
# replaced: no terminal here), then the app played with keys; the imports after each
NO_MODEL = f"""
import asyncio, json, sys
from roseplay.tui.app import RoseplayApp
from roseplay.workload.source import ReplaySource
from roseplay.cli import main

run, RoseplayApp.run = RoseplayApp.run, lambda self: None
rc = main(["--replay", {SESSION!r}])
RoseplayApp.run = run
cli = {{"rc": rc, "torch": "torch" in sys.modules}}

async def play():
    app = RoseplayApp(source=ReplaySource({SESSION!r}, start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("n", "n", "space")
        await pilot.pause(0.3)
        await pilot.press("q")

asyncio.run(play())
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))
print(json.dumps({{"cli": cli, "bad": bad}}))
"""


@pytest.fixture(scope="module")
def no_model_run() -> dict:
    out = subprocess.run([sys.executable, "-c", NO_MODEL], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_replay_needs_no_torch(no_model_run):
    assert no_model_run["bad"] == []


def test_cli_replay_does_not_load_a_model(no_model_run, tmp_path):
    assert no_model_run["cli"] == {"rc": 0, "torch": False}
    bad = subprocess.run([sys.executable, "-m", "roseplay", "--replay", str(tmp_path / "nope.gz")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot replay" in bad.stderr


def test_recorder_stops_at_its_size_limit_and_the_status_says_so(tmp_path):
    from roseplay.workload.record import Recorder
    src = live_source()
    try:
        rec = src.recorder = Recorder(str(tmp_path / "s.gz"), src.snapshot, src.workload,
                                      interval=0.02, max_bytes=20_000)
        assert src.position().startswith("● REC")
        deadline = time.monotonic() + 20
        while not rec.full and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rec.full and src.position().startswith("REC stopped: ")
        frames = rec.frames
        time.sleep(0.2)
        assert rec.frames == frames                  # nothing more is written
    finally:
        src.close()
    replay = load_recording(str(tmp_path / "s.gz"))
    assert len(replay) == frames and replay.describe_end() is None


def poll(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class FullDisk:
    """A file whose writes fail with ENOSPC after `flushes` flushes (a disk that fills
    while recording); what was written before is really on disk."""

    def __init__(self, path: str, flushes: int):
        self._f = open(path, "wb")
        self.flushes = flushes

    def write(self, data) -> int:
        if self.flushes <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._f.write(data)

    def flush(self) -> None:
        self.flushes -= 1
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


def test_disk_full_while_recording_stops_the_recorder_not_the_session(tmp_path, monkeypatch):
    import gzip

    from roseplay.workload import record
    path = str(tmp_path / "s.gz")
    monkeypatch.setattr(record.gzip, "open", lambda p, mode, **kw: io.TextIOWrapper(
        gzip.GzipFile(fileobj=FullDisk(p, 2), mode="wb", compresslevel=6),
        encoding="utf-8"))
    src = live_source()
    try:
        rec = src.recorder = record.Recorder(path, src.snapshot, src.workload, interval=0.02)
        poll(lambda: rec.error is not None)
        assert rec.full and src.position() == "REC stopped: No space left on device  "
        assert rec._thread.is_alive(), "the recorder thread died"
        done = src.driver.completed
        poll(lambda: src.driver.completed > done + 4)    # the session goes on
        assert src.loop.fatal_error is None
    finally:
        src.close()                       # the final frame cannot be written: no raise
    monkeypatch.undo()                    # a real gzip.open again, to read it back
    replay = load_recording(path)         # what was flushed before the disk filled
    assert len(replay) >= 1 and "cut off" in (replay.describe_end() or "")


def test_replay_keeps_frames_compressed_and_decodes_them_the_same():
    """Replay memory is the compressed groups (about the file's size), not the JSON."""
    import gzip
    rec = load_recording(SESSION)
    json_chars = sum(len(line) for line in gzip.open(SESSION, "rt"))
    held = sum(len(g) for g in rec._groups)
    assert held < json_chars / 4 and not hasattr(rec.entries[0], "line")
    keys = [i for i, e in enumerate(rec.entries) if e.key]
    assert len(rec._groups) == len(keys)
    forward = [rec[i].snapshot.step for i in range(len(rec))]
    backward = [rec[i].snapshot.step for i in reversed(range(len(rec)))]   # from keyframes
    assert forward == backward[::-1] == [e.step for e in rec.entries]


def test_a_steps_per_position_counts_are_checked_and_optional():
    """A step's per-position draft counts: absent in older recordings (no verifies shown),
    a JSON list of counts read back as a tuple, anything else refused."""
    from roseplay.workload.frames import _step_dict
    from roseplay.workload.record_schema import BadRecording, check_step
    from engine.snapshot import StepStats
    step = StepStats(3, 1.0, 0.01, 4, 0, (), 0, 0, 0, 0, 0, 1, 0, 4, 1, 3, 2,
                     spec_drafted_per_pos=(1, 1, 1), spec_accepted_per_pos=(1, 1, 0))
    d = json.loads(json.dumps(_step_dict(step)))
    assert check_step(dict(d))["spec_accepted_per_pos"] == (1, 1, 0)
    old = {k: v for k, v in d.items() if not k.endswith("_per_pos")}
    assert check_step(old)["spec_drafted_per_pos"] == ()
    for bad in ("3", [1, -1], [1.5], [1] * 99, None):
        with pytest.raises(BadRecording):
            check_step({**d, "spec_drafted_per_pos": bad})


def test_a_requests_swapped_flag_is_recorded_checked_and_optional():
    """`swapped` (preempted by swap: its KV in the host tier) round-trips, is absent in
    older recordings (read as not swapped) and is refused when not a bool."""
    from engine.snapshot import RequestView
    from roseplay.workload.frames import _req_dict
    from roseplay.workload.record_schema import BadRecording, check_request
    view = RequestView("r", "preempted", 1.0, 8, 0, 8, 0, 0, 2, 16, 0.1, None, None, (),
                       1, "", "", None, None, swapped=True)
    d = json.loads(json.dumps(_req_dict(view)))
    assert check_request(dict(d), 4)["swapped"] is True
    old = {k: v for k, v in d.items() if k != "swapped"}
    assert "swapped" not in check_request(old, 4)
    for bad in (1, "yes", None):
        with pytest.raises(BadRecording):
            check_request({**d, "swapped": bad}, 4)

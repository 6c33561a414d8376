"""Recordings are untrusted data: cut-off, damaged and hostile files (issue 18)."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.workload.frames import FrameEncoder
from roseplay.workload.record import header_for
from roseplay.workload.replay import Recording
from roseplay.workload.source import ReplaySource
from tests.roseplay.tui.helpers import SESSION, notices, screen_text, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _session_lines(keyframe_every: int = 5) -> list[str]:
    """The committed session re-encoded (format 2, a keyframe every few frames)."""
    rec = Recording(SESSION)
    enc = FrameEncoder(keyframe_every=keyframe_every)
    lines = [json.dumps(header_for(rec[0].snapshot))]
    for i in range(len(rec)):
        f = rec[i]
        lines.append(json.dumps(enc.encode(f.snapshot, f.t, f.workload)))
    return lines


def _write(path, lines) -> str:
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return str(path)


def _frames_on_disk(path: str) -> int:
    try:
        return len(Recording(path))
    except ValueError:                  # no header or no whole frame flushed yet
        return 0


def test_a_killed_session_replays_what_it_wrote(tmp_path):
    path = str(tmp_path / "killed.jsonl.gz")
    code = f"""
import sys, time
sys.path.insert(0, {ROOT!r})
from tests.roseplay.tui.helpers import live_source
src = live_source(record={path!r})
print("recording", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "recording"
        deadline = time.monotonic() + 30
        while _frames_on_disk(path) < 5:       # the recorder's flushes reached the file
            assert time.monotonic() < deadline, "the recorder flushed no frames"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    rec = Recording(path)
    assert len(rec) >= 5
    end = rec.describe_end()
    assert end.startswith("the file ends early (the recording was cut off): replay ends at")
    assert f"frame {len(rec)}" in end and f"step {rec.entries[-1].step}" in end
    assert rec[-1].snapshot.step == rec.entries[-1].step > 0


def test_a_truncated_file_replays_in_the_app_and_says_where_it_ends(tmp_path):
    data = open(_write(tmp_path / "full.gz", _session_lines()), "rb").read()
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    src = ReplaySource(str(path), start_paused=True)
    assert 3 < len(src.recording) < 45

    async def run():
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await wait_for(pilot, lambda: "cut off" in notices(app), 30)
            src.seek(len(src.recording) - 1)
            app.refresh_panels()
            await pilot.pause()
            assert "(cut off here)" in screen_text(app)
    import asyncio
    asyncio.run(run())


def test_damaged_lines_are_skipped_to_the_next_keyframe(tmp_path):
    lines = _session_lines(keyframe_every=5)
    lines[8] = lines[8][:40]                            # a cut line (frame 8)
    frame = json.loads(lines[17])
    frame["rc"] = "not base64!"                         # frame 17
    lines[17] = json.dumps(frame)
    rec = Recording(_write(tmp_path / "bad.gz", lines))
    # keyframes are frames 0, 5, 10, 15, 20 …: bad frame 7 and deltas 8-9, bad frame 16
    # and deltas 17-19 are skipped
    assert rec.skipped == 3 + 4
    assert len(rec) == 45 - 7
    assert "line 9: not JSON" in rec.notes[0] and "line 18: block array" in rec.notes[1]
    steps = [rec[i].snapshot.step for i in range(len(rec))]
    assert steps == sorted(steps)
    assert "damaged line(s) skipped" in rec.describe_end()


HOSTILE = {
    "refcount array of the wrong size": lambda f: f.update(rc="AAAA"),
    "block index past the pool": lambda f: f.update(new={"x": {**_REQ, "blocks": [10 ** 6]}},
                                                    order=[*f.get("order", []), "x"]),
    "string where a number goes": lambda f: f.update(counters={**f["counters"], "finished": "9"}),
    "negative knob": lambda f: f.update(knobs={**f["knobs"], "max_num_seqs": -1}),
    "unknown request in the order": lambda f: f.update(order=["ghost"]),
    "non-finite time": lambda f: f.update(time=float("nan")),
    "a list, not an object": None,
}
_REQ = dict(request_id="x", state="decoding", arrival_time=0.0, prompt_tokens=1,
            computed_tokens=1, prefill_target=1, chunks_done=0, cached_tokens=0,
            output_tokens=0, max_tokens=1, ttft=None, tpot=None, last_itl=None, blocks=[],
            preemptions=0, prompt_preview="", text="", finish_reason=None, error=None)


@pytest.mark.parametrize("mutation", list(HOSTILE))
def test_hostile_values_are_refused_line_by_line(tmp_path, mutation):
    lines = _session_lines(keyframe_every=100)
    frame = json.loads(lines[1])                        # the first (key) frame
    if HOSTILE[mutation] is None:
        lines[1] = "[1, 2, 3]"
    else:
        HOSTILE[mutation](frame)
        lines[1] = json.dumps(frame)                    # NaN is written as NaN: refused too
    with pytest.raises(ValueError, match="no readable frame"):
        Recording(_write(tmp_path / "h.gz", lines))     # the only keyframe is bad: nothing left
    lines[2:2] = [lines[1]]
    bad = tmp_path / "h2.gz"
    _write(bad, lines)
    out = subprocess.run([sys.executable, "-m", "roseplay", "--replay", str(bad)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("roseplay: error: cannot replay") and "Traceback" not in out.stderr


@pytest.mark.parametrize("content", [b"", b"not gzip at all", gzip.compress(b"{}\n", mtime=0),
                                     gzip.compress(b'{"kind":"header","version":99}\n', mtime=0)])
def test_files_that_are_not_recordings_get_one_line(tmp_path, content):
    path = tmp_path / "x.gz"
    path.write_bytes(content)
    out = subprocess.run([sys.executable, "-m", "roseplay", "--replay", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot replay" in out.stderr


ODD_VALUES = (None, -1, 0, 2 ** 40, 1.5, -0.0, "", "x" * 300, [], {}, [1, "a"], True)


def _mutate(obj, rng):
    """Replace one value somewhere inside a frame by an odd one."""
    path, node = [], obj
    while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if path:
        parent, key = path[-1]
        parent[key] = rng.choice(ODD_VALUES)


def test_random_damage_is_refused_or_replayed_and_drawn(tmp_path):
    """150 seeded single-value mutations of a frame: the file loads (the bad frame skipped
    or harmless) or is refused with a ValueError; whatever loads decodes and draws."""
    import asyncio
    import random
    from tests.roseplay.tui.helpers import StaticSource
    base = _session_lines(keyframe_every=10)[:21]      # 20 frames: keyframes 0 and 10
    rng = random.Random(18)
    loaded = []
    for trial in range(150):
        lines = list(base)
        i = rng.randrange(1, len(lines))
        frame = json.loads(lines[i])
        _mutate(frame, rng)
        lines[i] = json.dumps(frame)
        try:
            rec = Recording(_write(tmp_path / f"f{trial}.gz", lines))
        except ValueError:
            continue
        loaded.append(rec[min(len(rec) - 1, i)].snapshot)
    assert len(loaded) > 50

    async def draw():
        app = RoseplayApp(source=StaticSource(loaded[0]))
        async with app.run_test(size=(120, 40)) as pilot:
            for snap in loaded:
                app.source.snap = snap
                app.refresh_panels()
            await pilot.pause()
            assert "KV cache" in screen_text(app)
    asyncio.run(draw())

"""Recordings carry the lesson data (roseplay/workload/frames.py): token traces, TTFT splits, the
requests' split timestamps and each step's budget and mode, through a JSON file and
back; a replay shows them (the strip, the split, `w`); hostile trace values are
refused like any other damaged line."""
from __future__ import annotations

import base64
import dataclasses
import gzip
import json

import numpy as np
import pytest

from engine.config import MAX_SPECULATIVE_TOKENS
from engine.outputs import TOKEN_DRAFT, TokenTrace
from roseplay.tui.app import RoseplayApp
from roseplay.workload.frames import FrameDecoder, FrameEncoder
from roseplay.workload.record import header_for
from roseplay.workload.record_schema import BadRecording
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets.requests import fmt_ms
from roseplay.tui.widgets.step_strip import StepStrip
from tests.roseplay.tui.helpers import (logprobs_snapshots, replay_at_end, screen_text,
                                        select_shown, sync, widget_text)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def snaps():
    """Snapshots of a dummy engine serving logprobs requests in chunks (one seat: a
    queue), the last with a speculative trace and a verify's per-position counts added."""
    snaps = logprobs_snapshots(max_tokens=4, max_num_seqs=1)
    out, last = snaps[:-1], snaps[-1]
    spec = TokenTrace("s0", 3, np.arange(3, dtype="<i4").tobytes(),
                      np.array([1.0, 1.5, 1.5]).tobytes(), bytes([0, TOKEN_DRAFT | 8, 2 | 8]))
    verify = dataclasses.replace(last.recent_steps[-1], step=last.recent_steps[-1].step + 1,
                                 spec_drafted_per_pos=(1, 1), spec_accepted_per_pos=(1, 0))
    return out + [dataclasses.replace(last, spec_method="ngram", kv_cache_dtype="fp8",
                                      traces=last.traces + (spec,),
                                      recent_steps=last.recent_steps + (verify,))]


def _lines(snaps, keyframe_every: int = 4) -> list[str]:
    enc = FrameEncoder(keyframe_every=keyframe_every)
    return [json.dumps(header_for(snaps[0]))] + [
        json.dumps(enc.encode(s, i * 0.1, {"scenario": "x"})) for i, s in enumerate(snaps)]


def test_a_json_recording_keeps_the_lesson_data(snaps):
    last = snaps[-1]
    assert len(last.traces) == 4 and last.recent_ttft_parts and last.spec_method == "ngram"
    lines = _lines(snaps)
    dec = FrameDecoder(json.loads(lines[0]))
    for snap, line in zip(snaps, lines[1:]):
        back, _ = dec.decode(json.loads(line))
        assert back.traces == snap.traces
        assert back.recent_ttft_parts == snap.recent_ttft_parts
        assert [(s.budget, s.mode, s.spec_drafted_per_pos, s.spec_accepted_per_pos)
                for s in back.recent_steps] == \
            [(s.budget, s.mode, s.spec_drafted_per_pos, s.spec_accepted_per_pos)
             for s in snap.recent_steps]
        for a, b in zip(back.requests, snap.requests):
            assert (a.scheduled_ts, a.last_chunk_ts, a.prefill_chunks, a.prefill_preemptions) \
                == (b.scheduled_ts, b.last_chunk_ts, b.prefill_chunks, b.prefill_preemptions)
        assert (back.spec_method, back.logprobs_mode, back.kv_cache_dtype) == \
            (snap.spec_method, snap.logprobs_mode, snap.kv_cache_dtype)
    assert back.kv_cache_dtype == "fp8"
    assert any(s.spec_drafted_per_pos for s in back.recent_steps)   # verifies were recorded
    assert back.trace("r1").logprobs_at(2) == last.trace("r1").logprobs_at(2)


@sync
async def test_a_replay_shows_the_strip_the_split_and_the_scrub(snaps, tmp_path):
    path = tmp_path / "lesson.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(_lines(snaps)) + "\n")
    src, app = replay_at_end(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await select_shown(pilot, app, "r2")
        snap = src.snapshot()
        assert "budget 16 used" in widget_text(app.query_one(StepStrip))
        queued = snap.request("r2").ttft_split()[0]
        assert f"queue {fmt_ms(queued)}" in widget_text(app.detail)
        await pilot.press("w")
        await pilot.pause()
        assert "token 1 of 4" in screen_text(app) and "model p" in screen_text(app)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _one_token(good: dict, logprobs: bytes) -> dict:
    """A one-token trace with 3 logprob entries."""
    return {**good, "num_tokens": 1, "top": 3, "token_ids": _b64(np.zeros(1, "<i4").tobytes()),
            "times": _b64(np.zeros(1).tobytes()), "origin": _b64(b"\0"),
            "logprobs": _b64(logprobs), "raw_logprobs": ""}


NAN_LOGPROBS = (np.zeros(3, "<i4").tobytes() + np.full(3, np.nan).tobytes()
                + np.ones(1, "<i4").tobytes())
HOSTILE_TRACES = {
    "a NaN logprob": lambda g: _one_token(g, NAN_LOGPROBS),
    "ids shorter than the times": lambda g: {**g, "token_ids": _b64(b"\0" * 4)},
    "more drafts than k may be": lambda g: {**g, "origin": _b64(
        bytes([1 | (MAX_SPECULATIVE_TOKENS + 1) << 2] * len(base64.b64decode(g["origin"]))))},
    "times that are not base64": lambda g: {**g, "times": "!!"},
    "a negative top": lambda g: {**g, "top": -1},
}


@pytest.mark.parametrize("damage", [*HOSTILE_TRACES, "an order naming an unsent trace"])
def test_hostile_traces_are_refused(snaps, damage):
    frame = FrameEncoder().encode(snaps[-1], 0.0, {})       # a keyframe: every trace
    if damage in HOSTILE_TRACES:
        frame["tr"][0] = HOSTILE_TRACES[damage](frame["tr"][0])
    else:
        frame["tro"] = [*frame["tro"], "ghost"]
    dec = FrameDecoder(header_for(snaps[-1]))
    with pytest.raises(BadRecording):
        dec.decode(json.loads(json.dumps(frame)))


@sync
async def test_a_replay_moved_back_holds_no_trace_from_later(snaps, tmp_path):
    """Seen at the end, r2's trace is not offered once the replay seeks back to a frame
    where r2 has not ended (`w` and its hint: only what was known at that time). The
    hint is in the Selected panel's border, so it shows at 80x24 too."""
    path = tmp_path / "lesson.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(_lines(snaps)) + "\n")
    src = ReplaySource(str(path), start_paused=True)
    early = next(i for i, s in enumerate(snaps) if s.request("r2") is not None
                 and s.request("r2").state != "finished")
    app = RoseplayApp(source=src)
    async with app.run_test(size=(80, 24)) as pilot:
        src.seek(len(src.recording) - 1)
        await select_shown(pilot, app, "r2")
        assert app.traces.get("r2") is not None and "w tokens" in widget_text(app.detail)
        src.seek(early)
        app.refresh_panels()
        await pilot.pause()
        assert app.traces.get("r2") is None
        assert "w tokens" not in widget_text(app.detail)
        await pilot.press("w")
        await pilot.pause()
        assert "token 1 of" not in screen_text(app)

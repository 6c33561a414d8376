"""A recording keeps the text of the tokens its frames show (record_text.py
PieceTracker), so a replay's token scrub and token choices read as text, as they did
live, where before they showed token ids (a replay loads no tokenizer)."""
from __future__ import annotations

import gzip
import json

import pytest

from engine.tokenizer import load_tokenizer
from roseplay.workload.record import Recorder
from roseplay.workload.record_text import trace_ids
from roseplay.workload.replay import Recording
from roseplay.workload.source import ReplaySource
from tests.roseplay.tui.helpers import (logprobs_snapshots, replay_at_end, screen_text,
                                        select_shown, sync, widget_text)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def snaps():
    """Snapshots of a dummy engine serving requests that ask for 2 logprobs, raw too."""
    out = logprobs_snapshots(max_tokens=6, max_num_seqs=2)
    assert len(out[-1].traces) == 3
    return out


def _record(path, snaps, tokenizer):
    current = [snaps[0]]
    rec = Recorder(str(path), lambda: current[0], lambda: {}, interval=3600,
                   tokenizer=tokenizer)
    for snap in snaps:
        current[0] = snap
        rec.capture()
    rec.close()


def _shown_ids(snaps) -> set[int]:
    ids = set()
    for s in snaps:
        for t in s.traces:
            ids |= trace_ids(t)
        for v in s.requests:
            lp = v.logprobs
            while lp is not None:
                ids |= set(lp.token_ids)
                lp = lp.raw
    return ids


def test_each_shown_token_is_written_once_with_its_text(snaps, tmp_path):
    tokenizer = load_tokenizer("default")
    path = tmp_path / "s.jsonl.gz"
    _record(path, snaps, tokenizer)
    shown = _shown_ids(snaps)
    assert len(shown) > 6
    rec = Recording(str(path))
    assert rec.pieces == {i: tokenizer.decode([i]) for i in shown}
    with gzip.open(path, "rt") as fh:
        written = [k for line in fh for k in json.loads(line).get("pieces", {})]
    assert sorted(written) == sorted(str(i) for i in shown)     # once each
    assert ReplaySource(str(path)).tokenizer.decode([min(shown)]) == \
        tokenizer.decode([min(shown)])


def test_a_recording_without_a_tokenizer_has_no_pieces(snaps, tmp_path):
    path = tmp_path / "s.jsonl.gz"
    _record(path, snaps, None)
    assert Recording(str(path)).pieces == {}
    assert ReplaySource(str(path)).tokenizer is None


@pytest.mark.parametrize("pieces", [["a"], {"x": "a"}, {"-1": "a"}, {"5": 7},
                                    {"5": "a" * 1000}, {str(1 << 40): "a"}])
def test_a_frame_with_hostile_pieces_is_skipped_and_noted(snaps, tmp_path, pieces):
    tokenizer = load_tokenizer("default")
    good = tmp_path / "good.jsonl.gz"
    _record(good, snaps, tokenizer)
    with gzip.open(good, "rt") as fh:
        lines = [json.loads(line) for line in fh]
    frame = next(i for i, d in enumerate(lines) if "pieces" in d and i > 1)
    lines[frame]["pieces"] = pieces
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("\n".join(json.dumps(d) for d in lines) + "\n")
    rec = Recording(str(bad))
    assert rec.skipped >= 1 and "piece" in rec.notes[0], rec.notes
    assert len(rec) < len(Recording(str(good)))


@sync
async def test_the_replays_token_scrub_shows_text(snaps, tmp_path):
    tokenizer = load_tokenizer("default")
    path = tmp_path / "s.jsonl.gz"
    _record(path, snaps, tokenizer)
    src, app = replay_at_end(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await select_shown(pilot, app, "r1")
        trace = src.snapshot().trace("r1")
        first = tokenizer.decode([int(trace.ids()[0])]).replace("\n", "⏎")
        lp = src.snapshot().request("r1").logprobs
        choice = repr(tokenizer.decode([lp.token_ids[1]]).replace("\n", "⏎"))
        assert choice in widget_text(app.detail)           # the Selected panel's choices
        await pilot.press("w")
        await pilot.pause()
        text = screen_text(app)
        assert "token 1 of 6" in text and repr(first) in text, text
        for tok in trace.logprobs_at(0).token_ids[1:]:   # its distribution, as text
            assert repr(tokenizer.decode([tok]).replace("\n", "⏎")) in text, text

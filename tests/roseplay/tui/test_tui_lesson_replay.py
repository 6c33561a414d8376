"""Issue 22, defect 3: a replay lost all generated text ("this model has no tokenizer:
no text", which was false): the recording stored every `text` as "" and a replay loads
no tokenizer. The recorder now decodes each request's output as it records."""
from __future__ import annotations

import dataclasses

import pytest

from engine.snapshot import OUTPUT_TAIL
from engine.tokenizer import load_tokenizer
from roseplay.tui.app import RoseplayApp
from roseplay.workload.record import Recorder
from roseplay.workload.replay import Recording
from roseplay.workload.source import ReplaySource
from roseplay.tui.widgets.request_detail import RequestDetail
from tests.roseplay.tui.helpers import session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(120)

SPEECH = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and "
          "Juliet is the sun. Arise, fair sun, and kill the envious moon, who is already "
          "sick and pale with grief that thou her maid art far more fair than she. ") * 3


def _frames(tokenizer, steps):
    """Snapshots of one request whose output grows by each of `steps` tokens."""
    base = session_snapshot(12)
    view = next(r for r in base.requests if r.state == "decoding")
    ids = tokenizer.encode(SPEECH)
    n = 0
    for i, k in enumerate(steps):
        n += k
        tail = tuple(ids[max(0, n - OUTPUT_TAIL):n])
        v = dataclasses.replace(view, output_tokens=n, output_tail=tail, text="")
        yield dataclasses.replace(base, time=base.time + i, requests=(v,)), ids[:n]


def _record(path, tokenizer, steps):
    frames = list(_frames(tokenizer, steps))
    current = [frames[0][0]]
    rec = Recorder(str(path), lambda: current[0], lambda: {}, interval=3600,
                   tokenizer=tokenizer)
    for snap, _ in frames:
        current[0] = snap
        rec.capture()
    rec.close()
    return frames


def test_a_recording_keeps_each_requests_generated_text(tmp_path):
    tokenizer = load_tokenizer("default")
    path = tmp_path / "s.jsonl.gz"
    frames = _record(path, tokenizer, [1, 2, 3, 1, 5, 8, 2, 1, 4])
    recording = Recording(str(path))
    assert recording.header["text"] is True
    for i, (_, ids) in enumerate(frames):
        text = recording[i].snapshot.requests[0].text
        assert text == tokenizer.decode(ids, skip_special_tokens=True)


def test_output_that_went_by_unseen_leaves_a_gap_mark(tmp_path):
    """More than a tail's worth of tokens between two frames (a fast GPU engine)."""
    tokenizer = load_tokenizer("default")
    path = tmp_path / "s.jsonl.gz"
    frames = _record(path, tokenizer, [3, OUTPUT_TAIL + 10, 2])
    text = Recording(str(path))[-1].snapshot.requests[0].text
    ids = frames[-1][1]
    before = tokenizer.decode(ids[:3], skip_special_tokens=True)
    after = tokenizer.decode(ids[len(ids) - OUTPUT_TAIL - 2:], skip_special_tokens=True)
    assert text == before + " … " + after


@sync
async def test_the_replay_shows_the_recorded_text(tmp_path):
    tokenizer = load_tokenizer("default")
    path = tmp_path / "s.jsonl.gz"
    frames = _record(path, tokenizer, [4, 4, 4, 4])
    app = RoseplayApp(source=ReplaySource(str(path), start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(len(app.source.recording) - 1)
        app.refresh_panels()
        await pilot.pause()
        shown = widget_text(app.query_one(RequestDetail))
        words = tokenizer.decode(frames[-1][1]).split()
        assert " ".join(words[:3]) in " ".join(shown.split()), shown
        assert "no tokenizer" not in shown


def test_a_live_recording_of_the_bundled_model_replays_its_text(tmp_path):
    """The user's path: `roseplay --record` on the bundled model, then `--replay`."""
    import time

    from roseplay.workload.source import start_live
    path = str(tmp_path / "live.jsonl.gz")
    # the engine in this process: the recorder and the replay are the user's; the output
    # tails crossing an engine process: tests/engine/front/test_engine_contract.py
    src = start_live(dict(num_blocks=512), scenario="shared-prefix", concurrency=2,
                     input_len=32, output_len=16, record=path, in_process=True)
    try:
        deadline = time.monotonic() + 90
        while src.snapshot().counters.finished < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        live = {r.request_id: r for r in src.snapshot().requests if r.state == "finished"}
        assert live
    finally:
        src.close()
    replayed = Recording(path)[-1].snapshot
    tokenizer = load_tokenizer("default")
    for r in replayed.requests:
        if r.request_id in live:
            want = tokenizer.decode(list(live[r.request_id].output_tail),
                                    skip_special_tokens=True)
            assert r.text and r.text.endswith(want[-20:]), (r.text, want)


@sync
async def test_a_data_parallel_recording_says_its_pools_are_merged(tmp_path):
    """A recording keeps the front's merged snapshot: its replay says so (the KV title,
    a notice) rather than show the replicas' pools as one engine's."""
    from roseplay.tui.dp_actions import MERGED_NOTE
    from tests.roseplay.tui.helpers import notices
    snap = session_snapshot(12)
    path = tmp_path / "dp.jsonl.gz"
    rec = Recorder(str(path), lambda: snap, lambda: {"replicas": 2, "routing_policy":
                                                     "least_load"}, interval=3600)
    rec.close()
    app = RoseplayApp(source=ReplaySource(str(path), start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        assert f"2 replicas merged · {snap.num_blocks} × 16 tok" in app.kv.border_title
        assert MERGED_NOTE.format(n=2) in notices(app)
    single = tmp_path / "one.jsonl.gz"      # one engine: its pool, no note
    rec = Recorder(str(single), lambda: snap, lambda: {}, interval=3600)
    rec.close()
    app = RoseplayApp(source=ReplaySource(str(single), start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.refresh_panels()
        await pilot.pause()
        assert "merged" not in app.kv.border_title
        assert "data-parallel" not in notices(app)

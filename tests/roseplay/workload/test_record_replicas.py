"""A data-parallel session's recording keeps each replica's snapshot and the router's
decisions (record_replicas.py), so its replay draws the replicas' maps and the routing
card as live; before, it kept the front's merged snapshot only."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from engine.front.dp_views import merge_snapshots
from engine.front.router import ReplicaLoad, Router
from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.requests import arrange
from roseplay.workload.record import Recorder
from roseplay.workload.replay import Recording
from roseplay.workload.source import ReplaySource
from tests.roseplay.tui.helpers import screen_text, session_snapshot, sync, widget_text

pytestmark = pytest.mark.timeout(120)

FRAMES = 120            # past the keyframe at frame 100


class FakeFront:
    """What the recorder reads of a live data-parallel front."""

    def __init__(self):
        self.router = Router(2, 16, "least_load")
        self.snaps: list = []
        self.dead: set[int] = set()

    def replica_snapshots(self) -> list:
        return self.snaps

    def alive(self, rank: int) -> bool:
        return rank not in self.dead


def _record(path) -> list[dict]:
    """FRAMES frames; each routes a request (replica 1 dies at frame 110, the policy turns
    round_robin at 50). Returns what each frame's replay must show."""
    front = FakeFront()
    front.snaps, expected = [session_snapshot(5), session_snapshot(24)], []
    rec = Recorder(str(path), lambda: merge_snapshots(front.snaps), lambda: {"replicas": 2},
                   interval=3600, replicas_fn=lambda: front)
    for k in range(FRAMES):
        front.snaps = [session_snapshot(5 + k % 20), session_snapshot(24 - k % 20)]
        if k == 50:
            front.router.policy = "round_robin"
        if k == 110:
            front.dead.add(1)
        loads = [ReplicaLoad(k % 3, 2, 10), ReplicaLoad(1, k % 4, 5, alive=1 not in front.dead)]
        # the last frame routes the request a replay selects first (its routing card)
        first = arrange(merge_snapshots(front.snaps).requests)[0].request_id
        rid = f"req-{k}" if k < FRAMES - 1 else first
        front.router.choose(rid, list(range(40)), loads)
        rec.capture(force=True)
        expected.append({"steps": [s.step for s in front.snaps], "routed": list(front.router.routed),
                         "alive": [front.alive(r) for r in (0, 1)], "policy": front.router.policy,
                         "last": front.router.recent[-1], "snaps": list(front.snaps)})
    rec.close()
    return expected


def _check(front, want: dict) -> None:
    assert [s.step for s in front.replica_snapshots()] == want["steps"]
    assert front.router.routed == want["routed"] and front.router.policy == want["policy"]
    assert [front.alive(r) for r in range(front.size)] == want["alive"]
    assert front.router.recent[-1] == want["last"]        # costs keep a dead replica's inf
    for got, snap in zip(front.replica_snapshots(), want["snaps"]):
        assert np.array_equal(got.block_state, snap.block_state)
        assert [r.request_id for r in got.requests] == [r.request_id for r in snap.requests]


def test_each_frame_replays_the_replicas_and_the_routers_decisions(tmp_path):
    path = tmp_path / "dp.jsonl.gz"
    expected = _record(path)
    recording = Recording(str(path))
    n = expected[0]["snaps"][0].num_blocks
    assert recording.header["replica_blocks"] == [n, n] and recording.header["num_blocks"] == 2 * n
    assert len(recording) == FRAMES + 1 and not recording.skipped
    for i in (0, 1, 2, 60, 99, 100, 101, 115, 3, 119, 50):       # seeks back and forth
        _check(recording[i].replicas, expected[i])
    assert len(recording[119].replicas.router.recent) == 120      # all the router keeps
    assert recording[119].replicas.router.recent[-1].costs[1] == float("inf")


def test_a_frame_with_hostile_replicas_is_skipped_and_noted(tmp_path):
    path = tmp_path / "dp.jsonl.gz"
    _record(path)
    with gzip.open(path, "rt") as fh:
        lines = fh.read().splitlines()
    frame = json.loads(lines[5])                    # frame 4
    frame["dp"]["dec"][0]["chosen"] = 7             # a replica that does not exist
    lines[5] = json.dumps(frame)
    frame = json.loads(lines[105])                  # frame 104, after the keyframe at 100
    frame["dp"]["r"] = frame["dp"]["r"][:1]         # one replica missing
    lines[105] = json.dumps(frame)
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    recording = Recording(str(bad))
    # each up to the next keyframe: frames 4-99, then 104 to the end (the close's 120)
    assert recording.skipped == 96 + 17 and len(recording) == FRAMES + 1 - 113
    assert "decision" in recording.notes[0] and "replicas" in recording.notes[1]
    assert recording[-1].replicas is not None


@sync
async def test_a_data_parallel_replay_draws_the_replicas_and_the_routing_card(tmp_path):
    path = tmp_path / "dp.jsonl.gz"
    expected = _record(path)
    app = RoseplayApp(source=ReplaySource(str(path), start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(FRAMES - 1)
        app.refresh_panels()
        await pilot.pause()
        assert app.kv.replica_maps.display and "2 × 96 blocks" in app.kv.border_title
        assert "merged" not in app.kv.border_title
        last = expected[-1]["last"]
        assert app.requests.current.request_id == last.request_id
        assert f"{last.request_id} → replica {last.chosen} · round_robin" in widget_text(app.routing)
        assert "r1 routed 55 dead" in screen_text(app)      # dead: " dead" kept whole


def test_a_header_whose_replicas_do_not_make_its_pool_is_refused(tmp_path):
    """Each replica's pool is allocated on reading: their sum must be the merged pool
    (a hostile header asking for 64 pools of a million blocks is refused)."""
    path = tmp_path / "dp.jsonl.gz"
    _record(path)
    with gzip.open(path, "rt") as fh:
        lines = fh.read().splitlines()
    header = json.loads(lines[0])
    n = header["num_blocks"]
    for blocks in ([1 << 20] * 64, [n, n], [n / 2 + 0.5, n / 2 - 0.5], f"{n // 2},{n // 2}"):
        lines[0] = json.dumps(dict(header, replica_blocks=blocks))
        bad = tmp_path / "bad.jsonl.gz"
        with gzip.open(bad, "wt") as fh:
            fh.write("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match="replica_blocks"):
            Recording(str(bad))

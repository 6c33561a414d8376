"""A dead replica in the KV panel, on built snapshots (no engine): its head keeps " dead"
whole in the form that fits (at 120x40 it read "replica 1 · routed 786 …"), and its map
and KV line show its last snapshot as stopped: the map dimmed, the line "as of step N",
never as a live replica's figures."""
from __future__ import annotations

import dataclasses
from collections import deque

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.replica_load import ReplicaFigures
from roseplay.tui.widgets.replica_maps import MiniKVMap, load_text
from roseplay.workload.record_replicas import RecordedFront, RecordedRouter
from tests.roseplay.tui.helpers import StaticSource, session_snapshot, sync, widget_text

ROUTED = [912, 786]


class FrontSource(StaticSource):
    """A built snapshot with a data-parallel front of two replicas, replica 1 dead."""

    def __init__(self):
        snap = session_snapshot()
        self.dead_step = snap.step - 40      # the step replica 1 died after
        last = dataclasses.replace(snap, step=self.dead_step)
        super().__init__(snap)
        self.front = RecordedFront([snap, last], RecordedRouter("cache_aware", ROUTED,
                                                                deque(maxlen=64)),
                                   [True, False])

    def replicas(self):
        return self.front


def styles(strip) -> list:
    return [(s.style.color, s.style.bgcolor) for s in strip if s.text.strip()]


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
@sync
async def test_a_dead_replica_reads_dead_and_stopped_where_it_fits(size):
    src = FrontSource()
    app = RoseplayApp(source=src)
    async with app.run_test(size=size) as pilot:
        for _ in range(2):      # shown, laid out, then drawn at its width (a loaded box
            app.refresh_panels()    # laid it out after the first frame: `KV 40/96 @73`)
            await pilot.pause()
        live, dead = (widget_text(app.query_one(f"#replica-load-{r}")) for r in (0, 1))
        head = dead.splitlines()[0].rstrip()
        assert head.endswith(" dead") and "…" not in head, dead
        assert str(ROUTED[1]) in head and ("r1 " in head or "replica 1 " in head)
        kv = dead.splitlines()[2].rstrip()
        assert "…" not in kv and kv.endswith(f"{src.dead_step}"), dead
        assert "40/96" in kv and ("as of step" in kv or size == (80, 24))
        assert "dead" not in live and "step" not in live.splitlines()[2]
        # the dead map's pool drawn stopped, then as if live: faded, cell by cell
        live_map, dead_map = (app.query_one(f"#replica-map-{r}", MiniKVMap) for r in (0, 1))
        assert not live_map.stopped and dead_map.stopped
        rows = range(dead_map.size.height)
        faded = [styles(dead_map.render_line(y)) for y in rows]
        dead_map.show_pool(*dead_map._given[:3], stopped=False)
        shown = [styles(dead_map.render_line(y)) for y in rows]
        assert any(faded) and [len(r) for r in faded] == [len(r) for r in shown]
        assert all(a != b for fr, sr in zip(faded, shown) for a, b in zip(fr, sr))


def test_the_head_drops_words_before_dead():
    f = ReplicaFigures(rank=1, alive=False, waiting=3, running=4, used=40, total=96,
                       hit_rate=0.5, ttft_p50=0.1, tok_s=None, routed=786, step=73)
    heads = {w: load_text(f, w).plain.splitlines()[0] for w in (40, 24, 14)}
    assert heads == {40: "replica 1 · routed 786 dead", 24: "r1 routed 786 dead",
                     14: "r1 786 dead"}
    kvs = {w: load_text(f, w).plain.splitlines()[2] for w in (40, 24, 14)}
    assert kvs == {40: "KV 40/96 blocks · as of step 73", 24: "KV 40/96 · as of step 73",
                   14: "KV 40/96 @73"}


@pytest.mark.parametrize("dtype", ["auto", "fp8"])
def test_the_replicas_title_says_an_fp8_pool(dtype):
    """One pool's title says `fp8` (kv_panel.pool_title); the replicas' said nothing of it."""
    from roseplay.tui.dp_actions import replica_borders

    class Maps:
        def scale(self):
            return 1
    snap = dataclasses.replace(session_snapshot(), kv_cache_dtype=dtype)
    for width in (120, 36):
        title, _ = replica_borders(Maps(), [snap, snap], None, width)
        assert ("fp8" in title) == (dtype == "fp8"), title

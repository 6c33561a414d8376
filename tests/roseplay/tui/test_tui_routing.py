"""Data parallelism in the app: each replica's small KV map with its load, the routing
card of the selected request, and the policy key, checked against the DPClient's own
replica snapshots and RouteDecisions (two dummy:tiny engine processes, shared by the
module, paused but while a test needs steps: only those cost CPU)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.commands import typed_command
from roseplay.tui.keys import KEYS
from roseplay.tui.widgets.help import guides_text, keys_markdown
from roseplay.tui.widgets.kv_map import FREE
from roseplay.tui.widgets.replica_load import imbalance
from roseplay.tui.widgets.replica_maps import MiniKVMap, scale_blocks
from roseplay.tui.widgets.routing_card import RoutingCard, card_text
from engine.front.router import ReplicaLoad, RouteDecision
from devtools.borrowed import Borrowed
from tests.roseplay.tui.helpers import (ENGINE, fast_idle, live_source, screen_text, sync,
                                        wait_for, widget_text)

pytestmark = [pytest.mark.timeout(600)]
SIZES = ((80, 24), (120, 40), (200, 60))


@pytest.fixture(scope="module")
def source():
    from roseplay.workload.source import start_live
    src = start_live(dict(ENGINE, data_parallel_size=2, routing_policy="cache_aware"),
                     scenario="shared-prefix", concurrency=4, input_len=48, output_len=24,
                     paused=True)
    try:
        yield src
    finally:
        src.close()


@pytest.fixture
def app(source, monkeypatch):
    """The app on the module's replicas, paused: a test that needs steps resumes them."""
    fast_idle(monkeypatch)
    source.set_routing_policy("cache_aware")
    yield RoseplayApp(source=Borrowed(source))
    source.pause()


async def paused(pilot, source) -> list:
    """Run both replicas until 8 requests were routed in all (the first test; later ones
    find them routed), pause them and wait until their snapshots stop moving; their
    snapshots."""
    dp = source.replicas()
    source.resume()
    assert await wait_for(pilot, lambda: sum(dp.router.routed) >= 8, 120)
    source.pause()
    assert await wait_for(pilot, lambda: all(s.paused for s in dp.replica_snapshots()), 30)
    steps = None
    while steps != [s.step for s in dp.replica_snapshots()]:
        steps = [s.step for s in dp.replica_snapshots()]
        await pilot.pause(0.3)
    pilot.app.refresh_panels()
    await pilot.pause()
    return dp.replica_snapshots()


def load_of(snap) -> tuple[int, int]:
    states = [r.state for r in snap.requests]
    return (sum(s in ("waiting", "preempted") for s in states),
            sum(s in ("prefilling", "decoding", "dedup") for s in states))


@pytest.mark.parametrize("size", SIZES)
@sync
async def test_each_replica_has_its_map_and_its_load(app, source, size):
    dp = source.replicas()
    async with app.run_test(size=size) as pilot:
        snaps = await paused(pilot, source)
        routed = list(dp.router.routed)
        for r, snap in enumerate(snaps):
            col_map = app.query_one(f"#replica-map-{r}", MiniKVMap)
            text = widget_text(app.query_one(f"#replica-load-{r}"))
            waiting, running = load_of(snap)
            assert f"{snap.num_used}/{snap.num_blocks}" in text, text
            assert re.search(rf"\br{r}\b|replica {r}\b", text) and str(routed[r]) in text
            numbers = re.search(r"w(?:ait(?:ing)?)? ?(\d+)\D+?r(?:un(?:ning)?)? ?(\d+)", text)
            assert numbers and (int(numbers[1]), int(numbers[2])) == (waiting, running), text
            if size != (80, 24):        # (the narrowest form: "=N")
                assert f"4w+r {4 * waiting + running}" in text
            # the map: the pool scaled to fit without scrolling, blocks in use where
            # the replica's own snapshot has them
            state, *_ = scale_blocks(snap.block_state, snap.block_refcount, [], col_map.k)
            assert col_map.virtual_size.height <= col_map.size.height
            assert len(col_map._cat) == len(state)
            assert np.array_equal(col_map._cat != FREE, state != 0)
            assert "…" not in text          # each figure in a form that fits whole
        totals = widget_text(app.query_one("#replica-totals"))
        assert f"{routed[0]}/{routed[1]}" in totals and f"{imbalance(routed):.2f}" in totals
        assert "replicas" in app.kv.border_title or "× 96 blocks" in app.kv.border_title
        screen = screen_text(app)
        assert "Routing" in screen or size == (80, 24) and "hidden" in screen


@sync
async def test_the_routing_card_shows_what_the_router_weighed(app, source):
    dp = source.replicas()
    async with app.run_test(size=(120, 40)) as pilot:
        await paused(pilot, source)
        await pilot.press("down")       # a request selected: the card is its decision
        rid = app.requests.current.request_id
        decision = next(d for d in dp.router.recent if d.request_id == rid)
        app.refresh_panels()
        await pilot.pause()
        card = widget_text(app.query_one(RoutingCard))
        assert f"{rid} → replica {decision.chosen} · cache_aware" in card
        assert decision.reason in " ".join(line.strip("│ ") for line in card.splitlines())
        for r, load in enumerate(decision.loads):
            row = next(line for line in card.splitlines() if re.search(rf"[▶ ]r{r}\s", line))
            cells = row.strip("│ ").split()
            assert cells == [f"{'▶' if r == decision.chosen else ''}r{r}",
                             f"{decision.cached_blocks[r]}/{decision.prompt_blocks}",
                             str(load.waiting), str(load.running), str(load.active_blocks),
                             f"{decision.costs[r]:g}"], card
        chosen = app.query_one(f"#replica-load-{decision.chosen}")
        assert any("reverse" in str(s.style) for s in chosen._text.spans)   # marked


def test_a_card_shows_only_what_its_policy_weighed():
    loads = (ReplicaLoad(2, 3, 40), ReplicaLoad(0, 1, 8, alive=False))
    rr = RouteDecision("x", "round_robin", 0, "its turn", 3, (), loads, (11.0, float("inf")))
    text = card_text(rr, "x", 80).plain
    assert "blind to load and caches" in text and "cost" not in text and "cached" not in text
    assert "11" not in text                     # a figure round robin did not weigh
    ll = RouteDecision("y", "least_load", 0, "least 4 x waiting + running (11)", 3, (),
                       loads, (11.0, float("inf")))
    rows = card_text(ll, "y", 80).plain.splitlines()
    assert "4w+r" in rows[3] and rows[4].split() == ["▶r0", "2", "3", "40", "11"]
    assert rows[5].split() == ["r1", "0", "1", "8", "dead"]
    assert "no routing decision kept" in card_text(None, "z", 80, 256).plain


def test_a_typed_prompts_decision_outlives_the_routers_window():
    """The router keeps its latest few decisions; the app keeps a typed prompt's and a
    shown request's past them (the card a newcomer opens on you-1 after 300 others)."""
    from collections import deque
    from types import SimpleNamespace

    from roseplay.tui.dp_actions import DecisionStore
    loads = (ReplicaLoad(0, 1, 8), ReplicaLoad(0, 1, 8))

    def decision(rid):
        return RouteDecision(rid, "least_load", 1, "least", 3, (), loads, (1.0, 1.0))
    router, store = SimpleNamespace(recent=deque(maxlen=4)), DecisionStore()
    router.recent.extend([decision("you-1"), decision("w0-1")])
    assert store.find(router, "w0-1").request_id == "w0-1"      # shown while selected
    router.recent.extend(decision(f"w0-{i}") for i in range(2, 300))
    assert store.find(router, "you-1").request_id == "you-1"
    assert store.find(router, "w0-1").request_id == "w0-1"
    assert store.find(router, "w0-5") is None                    # never shown, gone
    for i in range(DecisionStore.KEEP + 4):                      # more shown than it keeps
        router.recent.append(decision(f"x-{i}"))
        assert store.find(router, f"x-{i}").request_id == f"x-{i}"
    assert store.find(router, "you-1") is None                   # the oldest went first
    assert store.find(router, f"x-{DecisionStore.KEEP + 3 - router.recent.maxlen}")


def test_a_recorded_routing_change_marks_the_plots_as_live():
    from roseplay.tui.marks import change_label, event_label
    assert event_label({"what": "routing", "policy": "cache_aware"}) == "route cache_aware"

    class Source:
        def workload(self):
            return {"routing_policy": "cache_aware"}
    assert change_label(Source(), "routing_policy") == "route cache_aware"


def test_scaled_blocks_keep_the_states_most_blocks_have():
    state = np.array([1, 1, 0, 0, 2, 2, 2, 0, 0, 0, 0, 1], np.int8)
    rc = np.array([1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], np.int32)
    cells, refs, sel = scale_blocks(state, rc, np.array([11]), 4)
    assert cells.tolist() == [1, 2, 0] and refs.tolist() == [3, 0, 1] and sel.tolist() == [2]
    assert scale_blocks(state, rc, np.array([5]), 1)[0] is state


@sync
async def test_the_policy_key_cycles_the_routers_policy_live(app, source):
    dp = source.replicas()
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.press("u")
        assert dp.router.policy == "round_robin"
        app.refresh_panels()
        await pilot.pause()
        assert "routing round_robin" in widget_text(app.status)
        assert re.search(r"u\s+round_robin\s+routing", widget_text(app.knobs))
        assert "round_robin (u)" in widget_text(app.query_one("#replica-totals"))
        source.resume()
        assert await wait_for(pilot, lambda: list(dp.router.recent)[-1].policy
                              == "round_robin", 60)     # the next requests go by it
        source.pause()
        await pilot.press("U", "U")
        assert dp.router.policy == "cache_first"
        await pilot.press("U")
        assert dp.router.policy == "consistent_hash"
        title, run = typed_command(app, "routing least_load")
        run()
        assert dp.router.policy == "least_load" and title == "routing policy least_load"
        await pilot.press("i", "u", "U")    # typed into the open prompt: text, not keys
        assert dp.router.policy == "least_load"
        assert app.prompt_bar.query_one("#prompt-input").value.endswith("uU")
    assert "| `u` |" in keys_markdown("live") and "| `U` |" in keys_markdown("live")
    assert any(k.display == "u" and k.action == "routing(1)" for k in KEYS)


@sync
async def test_a_routing_guide_starts_and_u_measures_its_versus(app, source):
    dp = source.replicas()      # (paused: the guide's setup, its card, the versus: no step)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.press("a")
        assert await wait_for(pilot, lambda: app.knobs.guide_run is not None, 10)
        assert dp.router.policy == "cache_aware"
        assert source.workload()["scenario"] == "manuals"
        assert await wait_for(pilot, lambda: "u (routing round_robin)" in widget_text(
            app.knobs), 20)     # the scorecard names the key that measures the versus
        await pilot.press("u")          # cache_aware -> round_robin: the versus, clean
        run = app.knobs.guide_run
        assert run is not None and run.side.key == "round-robin"
        assert dp.router.policy == "round_robin"
    assert "needs roseplay --data-parallel-size 2" in guides_text("live").plain


@sync
async def test_one_engine_has_no_replicas_and_refuses_the_key(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source(paused=True)      # (what the keys refuse needs no steps)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("u")
            assert any("data-parallel-size" in text for _, text in app.messages)
            assert not app.query_one("#routing").display
            assert app.query_one("#kv-map").display
            await pilot.press("question_mark")
            await pilot.press("a")      # a routing guide: refused, nothing changed
            assert app.knobs.guide_run is None
            assert src.workload()["scenario"] == "shared-prefix"
    finally:
        src.close()


def test_a_replicas_ttft_p50_is_the_timing_tables_figure():
    """A replica's `TTFT p50` was the median of its finished requests' TTFTs, the Timing
    table's of the first tokens in the window: two figures under one name."""
    import dataclasses

    from roseplay.tui.widgets.latency import pctl, window_ttfts
    from roseplay.tui.widgets.replica_load import WINDOW, ReplicaWindows
    from tests.roseplay.tui.helpers import session_snapshot
    snap = session_snapshot(12)
    base, t = snap.requests[0], snap.time
    decoding = [dataclasses.replace(base, request_id=f"d{i}", state="decoding",
                                    arrival_time=t - 2, ttft=1.0) for i in range(3)]
    snap = dataclasses.replace(snap, requests=tuple(decoding),
                               recent_latencies=((t - 1, 0.1, 0.01),))   # one finished
    figures, = ReplicaWindows().figures([snap], [3], [True])
    assert figures.ttft_p50 == pctl(window_ttfts(snap.requests, t - WINDOW), (50,))[0] == 1.0


@pytest.mark.parametrize("size", ((120, 40), (200, 60)))
@sync
async def test_this_step_names_the_replica_whose_step_it_is(app, source, size):
    """The merged snapshot's last step is one replica's: *This step* names that replica,
    with its own step number, running and waiting. It read `step N` with N the replicas'
    steps summed (the status line's count) over one replica's running and waiting."""
    from roseplay.tui.widgets.step import StepPanel
    dp = source.replicas()
    async with app.run_test(size=size) as pilot:
        snaps = await paused(pilot, source)
        assert await wait_for(pilot, lambda: app.snapshot is not None and
                              app.snapshot.last_step is not None)
        last = app.snapshot.last_step
        owner = next(r for r, s in enumerate(snaps) if any(
            x.wall_time == last.wall_time for x in s.recent_steps))
        app.refresh_panels()
        await pilot.pause()
        first = next(line for line in widget_text(app.query_one(StepPanel)).splitlines()
                     if "step" in line and "This step" not in line)
        assert re.search(rf"(replica |r){owner} step {last.step}\b", first), first
        assert f"running {last.num_running}  waiting {last.num_waiting}" in first, first
        assert dp.size == 2


@pytest.mark.parametrize("size", SIZES)
@sync
async def test_the_knobs_workload_line_is_whole_with_replicas(app, source, size):
    """80x24 puts the workload's knobs on one line; with replicas the routing policy
    made it `s shared-prefix  </> 4  r ∞  u…`: now whole words only (the policy left
    out where it does not fit: the status line names it)."""
    from roseplay.tui.widgets.knobs import KnobsPanel
    async with app.run_test(size=size) as pilot:
        assert await wait_for(pilot, lambda: app.snapshot is not None)
        app.refresh_panels()
        await pilot.pause()
        text = widget_text(app.query_one(KnobsPanel))
        assert "…" not in text.replace("… (? help)", ""), text
        assert "r ∞" in text or "request rate" in text, text
        policy = source.replicas().router.policy
        assert policy in text or policy in screen_text(app), screen_text(app)

"""Data parallelism in the app (a mixin of RoseplayApp, through Actions): each frame the
replicas' own snapshots go to their small KV maps (widgets/replica_maps.py) and the
router's decision for the selected request to the routing card (widgets/routing_card.py);
`u` / `U` cycle the routing policy live (DPClient.set_routing_policy).

The router keeps its latest RECENT_DECISIONS (seconds under load); the app keeps the
typed prompts' decisions and the selected requests' besides (DecisionStore), so the
card a newcomer opens on the prompt just typed is still there when they look."""
from __future__ import annotations

from collections import OrderedDict
from functools import partial

from engine.config import ROUTING_POLICIES
from roseplay.tui.widgets.knobs import cycled
from roseplay.tui.widgets.routing_card import card_rows
from roseplay.tui.widgets.borders import border_form
from roseplay.tui.widgets.stopped import with_caption
from roseplay.workload.own_prompts import OWN_PREFIX


# a recording keeps the front's merged snapshot (engine/front/dp_views.py merge_snapshots),
# not each replica's, nor the router's decisions
MERGED_NOTE = ("recorded with {n} data-parallel replicas: this replay shows their pools "
               "(one map, replica after replica) and requests merged; each replica's own "
               "map, its load and the routing card show live only")


class DecisionStore:
    """The routing decisions the app keeps past the router's window: the typed prompts'
    and those it showed for a selected request, the latest KEEP of them."""

    KEEP = 16

    def __init__(self):
        self._kept: OrderedDict = OrderedDict()

    def find(self, router, rid: str | None):
        """The router's decision for rid, else the one kept here (None: neither)."""
        kept, recent = self._kept, list(router.recent)
        for d in recent:
            if d.request_id.startswith(OWN_PREFIX):
                kept[d.request_id] = d
        found = next((d for d in reversed(recent) if d.request_id == rid), None) \
            if rid else None
        if found is not None:
            kept[rid] = found
            kept.move_to_end(rid)
        while len(kept) > self.KEEP:
            kept.popitem(last=False)
        return found or kept.get(rid)


class RoutingActions:
    def replicas(self):
        """The data-parallel front when the engine runs replicas, else None."""
        find = getattr(self.source, "replicas", None)
        return find() if find is not None else None

    def routing_rows(self) -> int:
        """The routing card's rows in the layout (0: one engine, no card)."""
        dp = self.replicas()
        return card_rows(dp.size) if dp is not None else 0

    def action_routing(self, direction: int) -> None:
        """The next routing policy (round_robin → least_load → consistent_hash →
        cache_first → cache_aware)."""
        dp = self.replicas()
        if self.source is None:
            return
        current = dp.router.policy if dp is not None else ROUTING_POLICIES[0]
        self.set_routing(cycled(ROUTING_POLICIES, current, direction))

    def set_routing(self, policy: str) -> None:
        """A policy by name (the palette's `routing cache_aware`); the message line then
        says what it weighs (knobs.py WORKLOAD_HELP)."""
        if self.source is not None:
            self._control(self.source.set_routing_policy, policy, knob="routing_policy")

    def show_replicas(self, snap, highlight, current, stop: int | None = None) -> bool:
        """Each replica's map and load, the router's totals and the selected request's
        routing card; False with one engine (the KV panel shows its one pool). `stop`:
        the step the engine stopped after (every replica dead), for the caption."""
        dp, kv = self.replicas(), self.kv
        on = dp is not None
        self.step_replica = None
        if kv.replica_maps.display != on:       # (a replica died: the maps stay)
            for widget in (kv.map, kv.legend, kv.host):
                widget.display = not on
            kv.replica_maps.display = on
        if not on:
            return False
        router = dp.router
        snaps, routed = dp.replica_snapshots(), list(router.routed)
        self.step_replica = step_replica(snaps, snap.last_step)
        figures = self.replica_windows.figures(snaps, routed,
                                               [dp.alive(r) for r in range(dp.size)])
        rid = current.request_id if current is not None else None
        decision = self.decisions.find(router, rid)
        chosen = decision.chosen if decision is not None else (
            dp.replica_of(rid) if rid else None)
        kv.replica_maps.show(snaps, figures, router.policy,
                             highlight.request_id if highlight is not None else None, chosen)
        self._replica_titles(snaps, stop)
        self.routing.show_decision(decision, rid, router.recent.maxlen)
        return True

    def _replica_titles(self, snaps, stop: int | None = None) -> None:
        self.kv.set_borders(partial(replica_borders, self.kv.replica_maps, snaps, stop))


def step_replica(snaps, step) -> int | None:
    """The replica that ran `step` (the merged snapshot's last step is one replica's):
    the one whose recent steps hold it, None if none does (it read as the replicas'
    summed step count over that replica's running and waiting)."""
    if step is None:
        return None
    return next((r for r, s in enumerate(snaps) if s is not None and any(
        x.wall_time == step.wall_time and x.step == step.step for x in s.recent_steps)), None)


def replica_borders(maps, snaps, stop: int | None, width: int) -> tuple[str, str]:
    """The KV panel's title and subtitle at `width` over the replicas' maps."""
    n = snaps[0].num_blocks
    fp8 = " · fp8" if snaps[0].kv_cache_dtype != "auto" else ""    # as one pool's title
    forms = (f"KV cache · {len(snaps)} replicas × {n} blocks × {snaps[0].block_size} tokens"
             f"{fp8}", f"KV · {len(snaps)} × {n} blocks{fp8}", f"KV · {len(snaps)} × {n} blocks")
    k = maps.scale()
    return (border_form(forms, width),
            with_caption(stop, f"1 cell = {k} blocks" if k > 1 else "", width))


"""A data-parallel session's replicas in a recording (roseplay/workload/record.py), so a
replay draws each replica's map, its load and the routing card as the live app does.

A frame of such a session carries `dp`: each replica's snapshot as its own delta stream
(one FrameEncoder per replica, its keyframes on the merged frame's), the router's
policy and per-replica routed counts, which replicas live, and the router's decisions
(engine/front/router.py RouteDecision): those made since the last frame, all it keeps on
a keyframe. The decoder checks every value as untrusted data (BadRecording) and hands
the replay a `RecordedFront`, which answers what the app asks of the live front
(engine/front/dp_client.py): `size`, `router`, `replica_snapshots()`, `alive(r)`,
`replica_of(id)`.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

from engine.config import ROUTING_POLICIES
from engine.front.router import RECENT_DECISIONS, ReplicaLoad, RouteDecision
from roseplay.workload.frames import FrameDecoder, FrameEncoder
from roseplay.workload.record_schema import BadRecording, is_type

MAX_REPLICAS = 64


def _decision_dict(d: RouteDecision) -> dict:
    out = dataclasses.asdict(d)
    out["loads"] = [[x.waiting, x.running, x.active_blocks, x.alive] for x in d.loads]
    out["costs"] = [c if c != float("inf") else None for c in d.costs]   # JSON has no inf
    return out


def _decision_from(d, size: int) -> RouteDecision:
    if not isinstance(d, dict):
        raise BadRecording("dp: a decision is not an object")
    ints = ("chosen", "prompt_blocks")
    if not (isinstance(d.get("request_id"), str) and d.get("policy") in ROUTING_POLICIES
            and isinstance(d.get("reason"), str) and all(is_type(d.get(k), "int") for k in ints)
            and 0 <= d["chosen"] < size and d["prompt_blocks"] >= 0):
        raise BadRecording("dp: a decision's id, policy, reason or replica is wrong")
    loads, costs, cached = d.get("loads"), d.get("costs"), d.get("cached_blocks")
    if not (isinstance(loads, list) and len(loads) == size and isinstance(costs, list)
            and len(costs) == size and is_type(cached, "tuple[int") and len(cached) in (0, size)):
        raise BadRecording("dp: a decision's loads, costs or cached blocks are wrong")
    if not all(isinstance(x, list) and len(x) == 4 and all(is_type(v, "int") for v in x[:3])
               and isinstance(x[3], bool) for x in loads):
        raise BadRecording("dp: a decision's load is not [waiting, running, blocks, alive]")
    if not all(c is None or (isinstance(c, (int, float)) and not isinstance(c, bool))
               for c in costs):
        raise BadRecording("dp: a decision's cost is not a number")
    return RouteDecision(d["request_id"], d["policy"], d["chosen"], d["reason"][:200],
                         d["prompt_blocks"], tuple(cached),
                         tuple(ReplicaLoad(*x) for x in loads),
                         tuple(float("inf") if c is None else float(c) for c in costs))


class ReplicaEncoder:
    """The `dp` part of each frame, from the live data-parallel front."""

    def __init__(self):
        self._encoders: list[FrameEncoder] = []
        self._last = None            # the newest decision written

    def encode(self, dp, snaps: list, t: float, key: bool) -> dict:
        """The `dp` part: `snaps` the replicas' snapshots the merged frame was made of."""
        if len(self._encoders) != len(snaps):
            self._encoders, key = [FrameEncoder() for _ in snaps], True
        router = dp.router
        recent = list(router.recent)
        seen = next((i for i in range(len(recent) - 1, -1, -1) if recent[i] is self._last),
                    None) if not key else None      # the newest written, by identity
        if seen is not None:
            recent = recent[seen + 1:]
        self._last = recent[-1] if recent else self._last
        return {"r": [enc.encode(s, t, {}, key=key) for enc, s in zip(self._encoders, snaps)],
                "policy": router.policy, "routed": list(router.routed),
                "alive": [bool(dp.alive(r)) for r in range(len(snaps))],
                "dec": [_decision_dict(d) for d in recent]}


@dataclass
class RecordedRouter:
    policy: str
    routed: list
    recent: deque


@dataclass
class RecordedFront:
    """A replay's data-parallel front: what the app reads of the live one."""
    snapshots: list
    router: RecordedRouter
    alive_flags: list

    @property
    def size(self) -> int:
        return len(self.snapshots)

    def replica_snapshots(self) -> list:
        return self.snapshots

    def alive(self, rank: int) -> bool:
        return self.alive_flags[rank]

    def replica_of(self, request_id: str) -> int | None:
        for r, snap in enumerate(self.snapshots):
            if any(v.request_id == request_id for v in snap.requests):
                return r
        return None


class ReplicaDecoder:
    """Rebuilds a RecordedFront per frame from the `dp` parts (checked: BadRecording)."""

    def __init__(self, header: dict):
        blocks = header.get("replica_blocks")
        if not (isinstance(blocks, list) and 1 <= len(blocks) <= MAX_REPLICAS
                and all(is_type(n, "int") for n in blocks)
                and sum(blocks) == header.get("num_blocks")):     # the merged pool's
            raise BadRecording("header: replica_blocks must list each replica's pool")
        self._decoders = [FrameDecoder(dict(header, num_blocks=n)) for n in blocks]
        self._recent: deque = deque(maxlen=RECENT_DECISIONS)

    def decode(self, part) -> RecordedFront:
        size = len(self._decoders)
        if not isinstance(part, dict) or not isinstance(part.get("r"), list) \
                or len(part["r"]) != size:
            raise BadRecording(f"dp: a frame without its {size} replicas")
        routed, alive, decisions = part.get("routed"), part.get("alive"), part.get("dec")
        if not (is_type(routed, "tuple[int") and len(routed) == size and isinstance(alive, list)
                and len(alive) == size and all(isinstance(a, bool) for a in alive)
                and part.get("policy") in ROUTING_POLICIES and isinstance(decisions, list)):
            raise BadRecording("dp: routed, alive, policy or decisions are wrong")
        snaps = [dec.decode(f)[0] for dec, f in zip(self._decoders, part["r"])]
        if part["r"][0].get("key"):
            self._recent.clear()
        self._recent.extend(_decision_from(d, size) for d in decisions)
        router = RecordedRouter(part["policy"], list(routed), deque(self._recent,
                                                                    maxlen=RECENT_DECISIONS))
        return RecordedFront(snaps, router, list(alive))

"""Each data-parallel replica's load and figures, read from its own snapshot (the
DPClient's `replica_snapshots()`): waiting, running, vLLM's 4 x waiting + running, KV
blocks in use, and over the last WINDOW seconds the prefix hit rate, TTFT p50 and output
tokens per second; with the router's requests per replica and their imbalance."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.codes import PREEMPTED, RUNNING_STATES, WAITING
from engine.metrics import prefix_hit_rate
from roseplay.tui.widgets.latency import window_ttfts

WINDOW = 10.0     # seconds, as the KV legend's and the Timing panel's "last 10 s"


@dataclass(frozen=True)
class ReplicaFigures:
    rank: int
    alive: bool
    waiting: int            # queued (waiting or preempted) in this replica's snapshot
    running: int
    used: int               # KV blocks in use
    total: int
    hit_rate: float | None  # last WINDOW s (None: no lookup)
    ttft_p50: float | None  # s, requests whose first token came in the last WINDOW s
    tok_s: float | None     # output tokens a second, last WINDOW s
    routed: int             # requests the router sent here
    step: int = 0           # its snapshot's (a dead replica's last: what its map shows)
    host: tuple = ()        # its host KV tier (none: empty): blocks, cached, swapped,
    #                         and the blocks copied to it and back since the engine started

    @property
    def score(self) -> int:
        """vLLM's data-parallel load score (the router's least_load)."""
        return 4 * self.waiting + self.running


def imbalance(routed) -> float | None:
    """Most requests on one replica / the mean (1.0: even); None before any."""
    total = sum(routed)
    return max(routed) * len(routed) / total if total else None


class ReplicaWindows:
    """Per replica, its counters over the last WINDOW seconds (fed each frame)."""

    def __init__(self):
        self._hist: list[deque] = []

    def figures(self, snaps, routed, alive) -> list[ReplicaFigures]:
        if len(self._hist) != len(snaps):
            self._hist = [deque() for _ in snaps]
        return [self._one(r, s, routed[r], alive[r]) for r, s in enumerate(snaps)]

    def _one(self, rank: int, snap, routed: int, alive: bool) -> ReplicaFigures:
        hist = self._hist[rank]
        if not hist or snap.time > hist[-1][0]:
            hist.append((snap.time, snap.counters))
        elif snap.time < hist[-1][0]:      # a new engine (restarted): start over
            hist.clear()
            hist.append((snap.time, snap.counters))
        while len(hist) > 2 and snap.time - hist[1][0] >= WINDOW:
            hist.popleft()
        t0, first = hist[0]
        last, span = snap.counters, snap.time - t0
        states = [r.state for r in snap.requests]
        # the Timing table's population: first tokens in the window (finished requests'
        # alone left out the ones still decoding, and a replica's "TTFT p50" read
        # another figure than the Timing table's)
        ttfts = window_ttfts(snap.requests, snap.time - WINDOW)
        return ReplicaFigures(
            rank, alive, sum(s in (WAITING, PREEMPTED) for s in states),
            sum(s in RUNNING_STATES for s in states), snap.num_used, snap.num_blocks,
            prefix_hit_rate(last.prefix_hit_tokens - first.prefix_hit_tokens,
                            last.prefix_queried_tokens - first.prefix_queried_tokens),
            float(np.median(ttfts)) if ttfts else None,
            (last.generated_tokens - first.generated_tokens) / span if span > 0 else None,
            routed, snap.step, host_figures(snap))


def host_figures(snap) -> tuple:
    """A replica's host tier: (blocks, cached, swapped, copied to, copied back), or ()."""
    state = snap.host_block_state
    if not len(state):
        return ()
    return (len(state), int((state == 2).sum()), int((state == 1).sum()),
            snap.counters.kv_offload_blocks, snap.counters.kv_reload_blocks)

"""The engine's event log: what a learner should see happen, with the blocks involved.

Built from each step's plan after the step (COW pairs, preemptions with the blocks
they freed, prefix hits with the blocks reused, dedup joins, finished prefill chunks
with the blocks they wrote) and from the pool's evictions. Bounded: the last
`MAX_EVENTS` events; snapshots carry them, the TUI lists them and flashes the blocks.
"""
from __future__ import annotations

from collections import deque

from engine.codes import (EV_CHUNK_DONE, EV_COW, EV_DEDUP_JOIN, EV_EVICT, EV_PREEMPT,
                          EV_PREFIX_HIT, EV_SPEC_VERIFY)
from engine.snapshot import EngineEvent

MAX_EVENTS = 256


class EventLog:
    def __init__(self, maxlen: int = MAX_EVENTS):
        self._events: deque[EngineEvent] = deque(maxlen=maxlen)

    def recent(self) -> tuple[EngineEvent, ...]:
        return tuple(self._events)

    def record(self, step: int, now: float, plan, evicted: list[int], block_size: int) -> None:
        add = self._events.append
        owners: dict[str, list[int]] = {}
        for src, dst, rid in plan.copies:
            owners.setdefault(rid, []).extend((src, dst))
        for rid, blocks in owners.items():
            add(EngineEvent(step, now, EV_COW, rid, tuple(blocks), f"{len(blocks) // 2} block copy"))
        for req, blocks in plan.preempted:
            add(EngineEvent(step, now, EV_PREEMPT, req.request_id, blocks,
                            f"{len(blocks)} blocks freed, recompute later"))
        if evicted:
            add(EngineEvent(step, now, EV_EVICT, None, tuple(evicted),
                            f"{len(evicted)} cached blocks reused"))
        for rid, blocks in plan.prefix_hits:
            add(EngineEvent(step, now, EV_PREFIX_HIT, rid, blocks,
                            f"{len(blocks) * block_size} prompt tokens from the cache"))
        for follower, leader in plan.dedup_joins:
            add(EngineEvent(step, now, EV_DEDUP_JOIN, follower, (), f"waits on {leader}"))
        for c in plan.prefills:
            req = c.request
            end = c.start + c.num_tokens
            first, last = c.start // block_size, (end - 1) // block_size
            add(EngineEvent(step, now, EV_CHUNK_DONE, req.request_id,
                            tuple(req.block_table[first:last + 1]),
                            f"{end}/{req.num_prefill_target} tokens"))
        for c in plan.verifies:      # speculative decoding (docs/SPECULATIVE.md)
            freed = f", {len(c.rolled_back)} block(s) rolled back" if c.rolled_back else ""
            add(EngineEvent(step, now, EV_SPEC_VERIFY, c.request.request_id, c.rolled_back,
                            f"{len(c.draft)} drafted, {c.accepted} accepted{freed}"))

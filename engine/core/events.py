"""The engine's event log: what a learner should see happen, with the blocks involved.

Built from each step's plan after the step (COW pairs, preemptions with the blocks
they freed, prefix hits with the blocks reused, dedup joins, finished prefill chunks
with the blocks they wrote; the host tier's copies: offloads, reloads, swaps and swap
fallbacks, with their device blocks) and from the pool's evictions. Bounded: the last
`MAX_EVENTS` events; snapshots carry them, the TUI lists them and flashes the blocks.
"""
from __future__ import annotations

from collections import deque

from engine.codes import (EV_CHUNK_DONE, EV_COW, EV_DEDUP_JOIN, EV_EVICT, EV_OFFLOAD,
                          EV_PREEMPT, EV_PREFIX_HIT, EV_RELOAD, EV_SPEC_VERIFY,
                          EV_SWAP_FALLBACK, EV_SWAP_IN, EV_SWAP_OUT)
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
        tier = plan.tier_step
        swapped = tier.swap_outs if tier is not None else {}
        for req, blocks in plan.preempted:
            rid = req.request_id
            if rid in swapped:
                add(EngineEvent(step, now, EV_SWAP_OUT, rid, blocks,
                                f"{len(swapped[rid])} blocks copied to the host tier, "
                                f"{len(blocks)} freed; resumes from the copy"))
                continue
            add(EngineEvent(step, now, EV_PREEMPT, rid, blocks,
                            f"{len(blocks)} blocks freed, recompute later"))
            if rid in plan.swap_fallbacks:
                add(EngineEvent(step, now, EV_SWAP_FALLBACK, rid, blocks,
                                "swap: the host tier is off or full, recompute instead"))
        if evicted:
            add(EngineEvent(step, now, EV_EVICT, None, tuple(evicted),
                            f"{len(evicted)} cached blocks reused"))
        if tier is not None:
            self._tier(step, now, tier, block_size)
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

    def _tier(self, step: int, now: float, tier, block_size: int) -> None:
        add = self._events.append
        if tier.offloaded:
            add(EngineEvent(step, now, EV_OFFLOAD, None, tuple(tier.offloaded),
                            f"{len(tier.offloaded)} evicted blocks copied to the host tier"))
        for rid, blocks in tier.reloads.items():
            add(EngineEvent(step, now, EV_RELOAD, rid, tuple(blocks),
                            f"{len(blocks) * block_size} prompt tokens from the host tier"))
        for rid, blocks in tier.swap_ins.items():
            add(EngineEvent(step, now, EV_SWAP_IN, rid, tuple(blocks),
                            f"{len(blocks)} blocks copied back from the host tier"))

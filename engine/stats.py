"""Cumulative counters, recent step stats and latency samples for snapshots and plots."""
from __future__ import annotations

import dataclasses
from collections import deque

from engine.kv.block_pool import BlockPool
from engine.request import Request, RequestStatus
from engine.snapshot import EngineCounters, StepStats

RECENT_STEPS = 256
RECENT_SAMPLES = 2048


class StatsRecorder:
    def __init__(self):
        self.counters = EngineCounters()
        self.last_step: StepStats | None = None
        self.recent_steps: deque[StepStats] = deque(maxlen=RECENT_STEPS)
        self.recent_latencies: deque = deque(maxlen=RECENT_SAMPLES)   # (t, ttft, tpot)
        self.recent_itls: deque = deque(maxlen=RECENT_SAMPLES)        # (t, gap)
        self.last_error: str | None = None
        self.peak_used_blocks = 0

    def on_step(self, step: StepStats, ran: bool, pool: BlockPool) -> None:
        c = self.counters
        idx = pool.index
        self.counters = dataclasses.replace(
            c, steps=c.steps + int(ran), prefill_tokens=c.prefill_tokens + step.prefill_tokens,
            decode_tokens=c.decode_tokens + step.decode_tokens,
            generated_tokens=c.generated_tokens + step.sampled,
            prefix_lookups=idx.lookups, prefix_hits=idx.hits,
            prefix_queried_tokens=idx.queried_tokens, prefix_hit_tokens=idx.hit_tokens,
            cow_copies=pool.cow_copies, evictions=pool.evictions,
            preemptions=c.preemptions + step.preemptions,
            dedup_joined=c.dedup_joined + step.dedup_joined)
        self.peak_used_blocks = max(self.peak_used_blocks, pool.num_used)
        if ran:
            self.last_step = step
            self.recent_steps.append(step)

    def on_finish(self, req: Request) -> None:
        c = self.counters
        st = req.status
        self.counters = dataclasses.replace(
            c, finished=c.finished + (st is RequestStatus.FINISHED),
            cancelled=c.cancelled + (st is RequestStatus.CANCELLED),
            errors=c.errors + (st is RequestStatus.ERROR))
        m = req.metrics()
        if m.ttft is not None:
            self.recent_latencies.append((m.last_token_time, m.ttft, m.tpot))

"""Step stats, recent step history and latency samples for snapshots and plots.

The cumulative counters themselves live in one `Counters` object (engine/snapshot.py)
shared with the pool, the prefix index and the scheduler; the recorder adds the step,
token and finish counts and keeps the recent samples.
"""
from __future__ import annotations

from collections import deque

import msgspec

from engine.core.kv.block_metrics import KVBlockMetrics
from engine.core.kv.block_pool import BlockPool
from engine.metrics import request_latencies
from engine.request import Request, RequestStatus
from engine.snapshot import ChunkInfo, Counters, StepStats

RECENT_STEPS = 256
RECENT_SAMPLES = 2048


class StatsRecorder:
    def __init__(self, counters: Counters):
        self.counters = counters
        self.last_step: StepStats | None = None
        self.recent_steps: deque[StepStats] = deque(maxlen=RECENT_STEPS)
        self.recent_latencies: deque = deque(maxlen=RECENT_SAMPLES)   # (t, ttft, tpot)
        self.recent_itls: deque = deque(maxlen=RECENT_SAMPLES)        # (t, gap)
        self.last_error: str | None = None
        self.peak_used_blocks = 0

    def on_step(self, plan, t0: float, now: float, sampled: int, num_running: int,
                num_waiting: int, num_evicted: int, pool: BlockPool) -> None:
        c = self.counters
        prefill_tokens = sum(ch.num_tokens for ch in plan.prefills)
        c.prefill_tokens += prefill_tokens
        c.decode_tokens += len(plan.decodes)
        c.generated_tokens += sampled
        self.peak_used_blocks = max(self.peak_used_blocks, pool.num_used)
        if not plan:
            return
        c.steps += 1
        chunks = tuple(ChunkInfo(ch.request.request_id, ch.start, ch.num_tokens,
                                 ch.request.num_prefill_target) for ch in plan.prefills)
        step = StepStats(c.steps, now, now - t0, len(plan.decodes), prefill_tokens, chunks,
                         plan.prefix_hit_blocks, len(plan.copies), num_evicted,
                         len(plan.preempted), len(plan.dedup_joins), num_running, num_waiting,
                         sampled)
        self.last_step = step
        self.recent_steps.append(step)

    def on_finish(self, req: Request) -> None:
        c = self.counters
        st = req.status
        c.finished += st is RequestStatus.FINISHED
        c.cancelled += st is RequestStatus.CANCELLED
        c.errors += st is RequestStatus.ERROR
        ttft, tpot, _ = request_latencies(req.arrival_time, req.token_times)
        if ttft is not None:
            self.recent_latencies.append((req.token_times[-1], ttft, tpot))


class EngineStats(msgspec.Struct, frozen=True):
    """The engine's gauges and counters for /metrics (vLLM's SchedulerStats/IterationStats
    in one message): built on the engine thread after steps (at most every
    CoreLoop.stats_interval) and when it goes idle, and sent to every client of the
    engine process whether or not anyone renders snapshots."""
    time: float = 0.0                  # perf_counter in the engine's process
    num_running: int = 0               # admitted: prefilling, decoding, dedup followers
    num_waiting: int = 0               # queued or preempted
    num_used_blocks: int = 0           # cached evictable blocks count as free (vLLM)
    num_blocks: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0            # prompt tokens computed (recomputation included)
    generation_tokens: int = 0
    finished: int = 0
    kv_block_metrics: KVBlockMetrics = msgspec.field(default_factory=KVBlockMetrics)


def engine_stats(engine, now: float) -> EngineStats:
    """The stats of an LLMEngine now (cheap: counts and the residency histograms)."""
    c, sched, pool = engine.counters, engine.scheduler, engine.pool
    return EngineStats(now, len(sched.running), len(sched.waiting), pool.num_used,
                       pool.num_blocks, c.prefix_queried_tokens, c.prefix_hit_tokens,
                       c.preemptions, c.prefill_tokens, c.generated_tokens, c.finished,
                       pool.lifetimes.freeze())

"""Step stats, recent step history and latency samples for snapshots and plots.

The cumulative counters themselves live in one `Counters` object (engine/core/kv/counters.py)
shared with the pool, the prefix index and the scheduler; the recorder adds the step,
token and finish counts and keeps the recent samples.
"""
from __future__ import annotations

from collections import deque

from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.outputs import TokenTrace
from engine.engine_stats import ITERATION_TOKENS_BUCKETS, EngineStats
from engine.kv_metrics import HistogramAccumulator
from engine.metrics import request_latencies
from engine.request import Request, RequestStatus
from engine.snapshot import ChunkInfo, StepStats, ttft_split

RECENT_STEPS = 256
RECENT_SAMPLES = 2048
TRACE_KEEP = 8      # token traces kept of each kind: the latest requests that ended having
#                     asked for logprobs, and the latest verified with drafts


class StatsRecorder:
    def __init__(self, counters: Counters):
        self.counters = counters
        self.last_step: StepStats | None = None
        self.recent_steps: deque[StepStats] = deque(maxlen=RECENT_STEPS)
        self.recent_latencies: deque = deque(maxlen=RECENT_SAMPLES)   # (t, ttft, tpot)
        self.recent_itls: deque = deque(maxlen=RECENT_SAMPLES)        # (t, gap)
        # (t, queued, prefill, last chunk to first token): the TTFT split of each
        # request in recent_latencies (the same t: its last token)
        self.recent_ttft_parts: deque = deque(maxlen=RECENT_SAMPLES)
        self._traces = (deque(maxlen=TRACE_KEEP), deque(maxlen=TRACE_KEEP))
        self._traces_tuple: tuple = ()
        self.last_error: str | None = None
        self.peak_used_blocks = 0
        self.iteration_tokens = HistogramAccumulator(ITERATION_TOKENS_BUCKETS)

    def on_step(self, plan, t0: float, now: float, sampled: int, num_running: int,
                num_waiting: int, num_evicted: int, pool: BlockPool) -> None:
        c = self.counters
        prefill_tokens = sum(ch.num_tokens for ch in plan.prefills)
        c.prefill_tokens += prefill_tokens
        decode_tokens = len(plan.decodes) + sum(ch.num_tokens for ch in plan.verifies)
        c.decode_tokens += decode_tokens
        c.generated_tokens += sampled
        self.peak_used_blocks = max(self.peak_used_blocks, pool.num_used)
        if not plan:
            return
        c.steps += 1
        self.iteration_tokens.add(prefill_tokens + sampled)
        chunks = tuple(ChunkInfo(ch.request.request_id, ch.start, ch.num_tokens,
                                 ch.request.num_prefill_target) for ch in plan.prefills)
        step = StepStats(c.steps, now, now - t0, decode_tokens, prefill_tokens, chunks,
                         plan.prefix_hit_blocks, len(plan.copies), num_evicted,
                         len(plan.preempted), len(plan.dedup_joins), num_running, num_waiting,
                         sampled, len(plan.verifies), sum(len(v.draft) for v in plan.verifies),
                         sum(v.accepted for v in plan.verifies), plan.budget, plan.mode,
                         *tier_moves(plan.tier_step), spec_off=plan.spec_off,
                         **spec_positions(plan.spec_positions))
        self.last_step = step
        self.recent_steps.append(step)

    def on_finish(self, req: Request, trace: TokenTrace | None) -> None:
        """Count an ended request; keep its trace (engine/core/token_trace.py build_trace)."""
        c = self.counters
        st = req.status
        c.finished += st is RequestStatus.FINISHED
        c.cancelled += st is RequestStatus.CANCELLED
        c.errors += st is RequestStatus.ERROR
        ttft, tpot, _ = request_latencies(req.arrival_time, req.token_times)
        if ttft is not None:
            t = req.token_times[-1]
            self.recent_latencies.append((t, ttft, tpot))
            parts = ttft_split(req.arrival_time, ttft, req.scheduled_ts, req.last_chunk_ts)
            if parts is not None:
                self.recent_ttft_parts.append((t, *parts))
        if trace is not None:
            self._traces[bool(req.spec_trace)].append(trace)
            self._traces_tuple = tuple(self._traces[0]) + tuple(self._traces[1])

    def traces(self) -> tuple:
        """The token traces kept (engine/core/token_trace.py): logprobs ones, then
        speculative ones, each oldest first."""
        return self._traces_tuple


def spec_positions(positions: tuple) -> dict:
    """StepStats' per-position counts of a step's verifies, as the speculative decoder
    counted them when it read the tokens (StepPlan.spec_positions; none: no verify)."""
    if not positions:
        return {}
    return {"spec_drafted_per_pos": positions[0], "spec_accepted_per_pos": positions[1]}


def tier_moves(tier) -> tuple[int, int, int, int]:
    """A step's host-tier copies: blocks to and from the host, then their bytes."""
    if tier is None:
        return 0, 0, 0, 0
    out, back = tier.blocks_out, tier.blocks_in
    return out, back, out * tier.bytes_per_block, back * tier.bytes_per_block


def engine_stats(engine, now: float) -> EngineStats:
    """The stats of an LLMEngine now (cheap: counts and the residency histograms)."""
    c, sched, pool = engine.counters, engine.scheduler, engine.pool
    return EngineStats(now, len(sched.running), len(sched.waiting), pool.num_used,
                       pool.num_blocks, c.prefix_queried_tokens, c.prefix_hit_tokens,
                       c.preemptions, c.prefill_tokens, c.generated_tokens, c.finished,
                       pool.lifetimes.freeze(), c.spec_decode_num_drafts,
                       c.spec_decode_num_draft_tokens, c.spec_decode_num_accepted_tokens,
                       engine.spec.per_position(),
                       spec_draft_num_used_blocks=engine.spec.draft_used_blocks(),
                       spec_draft_faults=getattr(engine.spec.draft, "faults", 0),
                       spec_draft_disabled=getattr(engine.spec.draft, "disabled", False),
                       kv_events_seq=engine.kv_events.seq if engine.kv_events else -1,
                       iteration_tokens=engine.stats.iteration_tokens.freeze(),
                       **host_stats(engine.host))


def host_stats(host) -> dict:
    """The host tier's EngineStats fields (none without a tier: the defaults)."""
    if host is None:
        return {}
    c, size = host.sync_times(), host.bytes_per_block
    return dict(host_num_blocks=host.num_blocks, host_num_used_blocks=host.pool.num_used,
                kv_offload_bytes=(c.kv_offload_blocks * size, c.kv_reload_blocks * size),
                kv_offload_seconds=(c.kv_offload_us / 1e6, c.kv_reload_us / 1e6),
                kv_offload_sizes=tuple(h.freeze() for h in host.sizes))

"""Immutable views of the engine for the UI (and tests, and recordings).

The engine thread builds an `EngineSnapshot` after a step and swaps a reference; readers
never lock and never see a half-updated state. Block arrays are fresh numpy copies.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from engine.codes import (BLOCK_CACHED, BLOCK_FREE, BLOCK_USED, CANCELLED, DECODING, DEDUP,
                          ERROR, EVENT_KINDS, FINISHED, PREEMPTED, PREFILLING, WAITING)
from engine.config import SchedulerConfig
from engine.kv.block_metrics import KVBlockMetrics
from engine.metrics import request_latencies
from engine.request import Request, RequestStatus

OUTPUT_TAIL = 64    # output token ids a RequestView carries (viewers detokenize them)


@dataclass(frozen=True)
class ChunkInfo:
    request_id: str
    start: int
    num_tokens: int
    total: int          # tokens this admission must compute before sampling


@dataclass(frozen=True)
class EngineEvent:
    """Something a learner should see happen, with the KV blocks it involved.

    cow: blocks = (src, dst) pairs flattened; preempt: the blocks freed; evict: the
    cached blocks reused; prefix_hit: the blocks reused; dedup_join: the leader's request
    id in `detail`; chunk_done: the blocks the chunk wrote, `detail` = "k/n tokens"."""
    step: int
    time: float
    kind: str
    request_id: str | None
    blocks: tuple[int, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class StepStats:
    step: int
    wall_time: float                 # perf_counter at the end of the step
    duration: float                  # seconds
    decode_tokens: int
    prefill_tokens: int
    prefill_chunks: tuple[ChunkInfo, ...]
    prefix_hit_blocks: int
    cow_copies: int
    evictions: int
    preemptions: int
    dedup_joined: int
    num_running: int
    num_waiting: int
    sampled: int


@dataclass(frozen=True)
class EngineCounters:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    generated_tokens: int = 0
    prefix_lookups: int = 0
    prefix_hits: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    cow_copies: int = 0
    evictions: int = 0
    preemptions: int = 0
    dedup_joined: int = 0
    finished: int = 0
    cancelled: int = 0
    errors: int = 0
    device_wait_us: int = 0     # host blocked on the GPU (the step's sync): 1 - this / wall
    #                             = the share of the engine thread's time spent on the host
    snapshot_build_us: int = 0  # building (and, in the engine process, encoding)
    #                             snapshots for viewers: what watching costs the engine
    gc_pause_us: int = 0        # the engine process's garbage-collection pauses

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0

    def minus(self, earlier: "EngineCounters") -> "EngineCounters":
        """The counts between two snapshots (windowed rates, a run's share)."""
        return EngineCounters(**{n: getattr(self, n) - getattr(earlier, n) for n in _COUNTER_NAMES})


_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(EngineCounters))


class Counters:
    """The engine's cumulative counters: ONE mutable owner, shared by the block pool,
    the prefix index, the scheduler and the stats recorder (each adds to its own
    fields); snapshots freeze a copy as EngineCounters."""
    __slots__ = _COUNTER_NAMES

    def __init__(self):
        for name in _COUNTER_NAMES:
            setattr(self, name, 0)

    def freeze(self) -> EngineCounters:
        return EngineCounters(**{n: getattr(self, n) for n in _COUNTER_NAMES})


@dataclass(slots=True, unsafe_hash=True)   # not frozen: hundreds are built per snapshot,
class RequestView:                          # and a frozen init costs 8x (treat as read-only)
    request_id: str
    state: str
    arrival_time: float
    prompt_tokens: int
    computed_tokens: int     # KV positions computed (prefill progress: vs prefill_target)
    prefill_target: int
    chunks_done: int
    cached_tokens: int       # prompt tokens served by the prefix cache
    output_tokens: int
    max_tokens: int
    ttft: float | None
    tpot: float | None
    last_itl: float | None
    blocks: tuple[int, ...]
    preemptions: int
    prompt_preview: str
    text: str                # "" from the engine (it never detokenizes): see output_tail
    finish_reason: str | None
    error: str | None
    output_tail: tuple[int, ...] = ()   # the last OUTPUT_TAIL output token ids
    priority: int = 0        # scheduling_policy=priority: lower is served first

    def chunks_total(self, budget: int) -> int:
        """Chunks this prefill takes at the given budget (done + still needed)."""
        left = max(0, self.prefill_target - self.computed_tokens)
        return self.chunks_done + math.ceil(left / max(1, budget))


def compact_counts(counts: np.ndarray) -> np.ndarray:
    """A copy in the smallest unsigned dtype that holds it: refcounts are nearly all 0-1,
    and a full pool's int32 array is most of a snapshot's bytes (viewers read values)."""
    top = int(counts.max(initial=0))
    dtype = np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else counts.dtype
    return counts.astype(dtype)


def request_state(req: Request) -> str:
    st = req.status
    if st is RequestStatus.WAITING:
        return PREEMPTED if req.num_preemptions else WAITING
    if st is RequestStatus.RUNNING:
        if req.dedup_leader is not None:
            return DEDUP
        return PREFILLING if req.num_uncomputed > 1 else DECODING
    return {RequestStatus.FINISHED: FINISHED, RequestStatus.CANCELLED: CANCELLED,
            RequestStatus.ERROR: ERROR}[st]


def request_view(req: Request) -> RequestView:
    ttft, tpot, itl = request_latencies(req.arrival_time, req.token_times)
    preview = req.prompt[:80] if req.prompt is not None else f"<{req.num_prompt_tokens} token ids>"
    return RequestView(req.request_id, request_state(req), req.arrival_time,
                       req.num_prompt_tokens, req.num_computed_tokens, req.num_prefill_target,
                       req.chunks_done, req.num_cached_tokens, len(req.output_token_ids),
                       req.params.max_tokens, ttft, tpot, itl, tuple(req.block_table),
                       req.num_preemptions, preview, "", req.finish_reason, req.error,
                       tuple(req.output_token_ids[-OUTPUT_TAIL:]), req.priority)


@dataclass(frozen=True)
class EngineSnapshot:
    time: float
    step: int
    model: str
    device: str
    dtype: str
    knobs: SchedulerConfig
    paused: bool
    num_blocks: int
    block_size: int
    block_state: np.ndarray          # int8 per block: 0 free, 1 used, 2 cached-evictable
    block_refcount: np.ndarray       # int32 per block
    requests: tuple[RequestView, ...]   # active then recently finished, by arrival
    last_step: StepStats | None
    recent_steps: tuple[StepStats, ...]
    counters: EngineCounters
    recent_latencies: tuple[tuple[float, float, float | None], ...] = ()  # (finish time, ttft, tpot)
    recent_itls: tuple[tuple[float, float], ...] = ()                      # (time, gap)
    error: str | None = None
    extra: dict = field(default_factory=dict)
    events: tuple[EngineEvent, ...] = ()     # the most recent engine events, oldest first
    kv_block_metrics: KVBlockMetrics = KVBlockMetrics()   # residency histograms, cumulative

    @property
    def num_used(self) -> int:
        return int((self.block_state == BLOCK_USED).sum())

    @property
    def num_cached(self) -> int:
        return int((self.block_state == BLOCK_CACHED).sum())

    @property
    def num_free(self) -> int:
        return int((self.block_state == BLOCK_FREE).sum())

    @property
    def num_shared(self) -> int:
        return int((self.block_refcount > 1).sum())

    def request(self, request_id: str) -> RequestView | None:
        return next((r for r in self.requests if r.request_id == request_id), None)


def engine_snapshot(engine, paused: bool = False) -> EngineSnapshot:
    """An immutable view of an LLMEngine now (cheap: arrays copied, views built)."""
    st, pool, kv = engine.stats, engine.pool, engine.runner.kv_cache
    active = tuple(request_view(r) for r in engine.requests.values())
    return EngineSnapshot(
        time=engine.clock.now(), step=st.counters.steps, model=engine.model_name,
        device=str(engine.device), dtype=str(engine.dtype).removeprefix("torch."),
        knobs=engine.knobs, paused=paused, num_blocks=pool.num_blocks,
        block_size=pool.block_size, block_state=pool.states(),
        block_refcount=compact_counts(pool.refcounts),
        requests=active + tuple(engine.recent_finished), last_step=st.last_step,
        recent_steps=tuple(st.recent_steps), counters=st.counters.freeze(),
        recent_latencies=tuple(st.recent_latencies), recent_itls=tuple(st.recent_itls),
        error=st.last_error, events=engine.events.recent(),
        kv_block_metrics=pool.lifetimes.freeze(),
        extra={"peak_used_blocks": st.peak_used_blocks, "backend": engine.backend,
               "tensor_parallel_size": engine.config.tensor_parallel_size,
               "kv_bytes_per_rank": kv.numel() * kv.element_size(),
               "max_model_len": engine.max_model_len,
               "forward_calls": engine.runner.forward_calls})

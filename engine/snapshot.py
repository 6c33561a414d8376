"""Immutable views of the engine for the UI (and tests, and recordings).

The engine thread builds an `EngineSnapshot` after a step and swaps a reference; readers
never lock and never see a half-updated state. Block arrays are fresh numpy copies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.config import SchedulerConfig
from engine.request import Request, RequestStatus

# request states shown to users
WAITING, PREFILLING, DECODING, PREEMPTED, DEDUP = "waiting", "prefilling", "decoding", "preempted", "dedup"
FINISHED, CANCELLED, ERROR = "finished", "cancelled", "error"


@dataclass(frozen=True)
class ChunkInfo:
    request_id: str
    start: int
    num_tokens: int
    total: int          # tokens this admission must compute before sampling


# engine event kinds (EngineEvent.kind), for the event log and the map's highlights
EV_COW, EV_PREEMPT, EV_EVICT, EV_PREFIX_HIT = "cow", "preempt", "evict", "prefix_hit"
EV_DEDUP_JOIN, EV_CHUNK_DONE = "dedup_join", "chunk_done"
EVENT_KINDS = (EV_COW, EV_PREEMPT, EV_EVICT, EV_PREFIX_HIT, EV_DEDUP_JOIN, EV_CHUNK_DONE)


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

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0


@dataclass(frozen=True)
class RequestView:
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
    text: str
    finish_reason: str | None
    error: str | None

    def chunks_total(self, budget: int) -> int:
        """Chunks this prefill takes at the given budget (done + still needed)."""
        left = max(0, self.prefill_target - self.computed_tokens)
        return self.chunks_done + math.ceil(left / max(1, budget))


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


def request_view(req: Request, chunks_done: int = 0) -> RequestView:
    times = req.token_times
    ttft = times[0] - req.arrival_time if times else None
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    itl = times[-1] - times[-2] if len(times) > 1 else None
    preview = req.prompt[:80] if req.prompt is not None else f"<{req.num_prompt_tokens} token ids>"
    return RequestView(req.request_id, request_state(req), req.arrival_time,
                       req.num_prompt_tokens, req.num_computed_tokens, req.num_prefill_target,
                       chunks_done, req.num_cached_tokens, len(req.output_token_ids),
                       req.params.max_tokens, ttft, tpot, itl, tuple(req.block_table),
                       req.num_preemptions, preview, req.text, req.finish_reason, req.error)


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

    @property
    def num_used(self) -> int:
        return int((self.block_state == 1).sum())

    @property
    def num_cached(self) -> int:
        return int((self.block_state == 2).sum())

    @property
    def num_free(self) -> int:
        return int((self.block_state == 0).sum())

    @property
    def num_shared(self) -> int:
        return int((self.block_refcount > 1).sum())

    def request(self, request_id: str) -> RequestView | None:
        return next((r for r in self.requests if r.request_id == request_id), None)

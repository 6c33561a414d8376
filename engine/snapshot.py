"""Immutable views of the engine for the UI (and tests, and recordings): the schema.

The engine thread builds an `EngineSnapshot` after a step and swaps a reference; readers
never lock and never see a half-updated state. Block arrays are fresh numpy copies. The
builders and the mutable counters live in the core (engine/core/views.py,
engine/core/kv/counters.py).
Between processes a snapshot travels as a typed SnapshotFrame (engine/ipc/protocol.py)
and is rebuilt into this view on the client side.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from engine.codes import BLOCK_CACHED, BLOCK_FREE, BLOCK_USED
from engine.config import SchedulerConfig
from engine.kv_metrics import KVBlockMetrics
from engine.outputs import TokenLogprobs

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
    spec_verified: int = 0          # speculative decoding: requests verified with drafts,
    spec_draft_tokens: int = 0      # the drafts they proposed,
    spec_accepted_tokens: int = 0   # the drafts accepted (docs/SPECULATIVE.md)


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
    spec_decode_num_drafts: int = 0          # speculative decoding (vLLM's names): requests
    spec_decode_num_draft_tokens: int = 0    # verified with drafts, drafts proposed,
    spec_decode_num_accepted_tokens: int = 0  # drafts accepted

    def minus(self, earlier: "EngineCounters") -> "EngineCounters":
        """The counts between two snapshots (windowed rates, a run's share)."""
        return EngineCounters(**{n: getattr(self, n) - getattr(earlier, n) for n in _COUNTER_NAMES})

    def spec_acceptance(self, earlier: "EngineCounters") -> tuple[float, float]:
        """Since `earlier`: the drafts' acceptance rate (0..1) and the mean accepted length
        (tokens a verify emits: 1 + accepted drafts per verified request, vLLM's
        definition); NaN both where no request was verified with drafts."""
        d = self.minus(earlier)
        if d.spec_decode_num_drafts <= 0 or d.spec_decode_num_draft_tokens <= 0:
            return math.nan, math.nan
        return (d.spec_decode_num_accepted_tokens / d.spec_decode_num_draft_tokens,
                1.0 + d.spec_decode_num_accepted_tokens / d.spec_decode_num_drafts)


_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(EngineCounters))


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
    spec_draft_tokens: int = 0       # speculative decoding: drafts verified for it,
    spec_accepted_tokens: int = 0    # and accepted
    logprobs: TokenLogprobs | None = None   # its latest token's (when it asked for logprobs)

    def chunks_total(self, budget: int) -> int:
        """Chunks this prefill takes at the given budget (done + still needed)."""
        left = max(0, self.prefill_target - self.computed_tokens)
        return self.chunks_done + math.ceil(left / max(1, budget))


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
    events: tuple[EngineEvent, ...] = ()     # the most recent engine events, oldest first
    kv_block_metrics: KVBlockMetrics = KVBlockMetrics()   # residency histograms, cumulative
    peak_used_blocks: int = 0        # since start or reset_peak_usage()
    backend: str = ""                # the attention backend serving
    tensor_parallel_size: int = 1
    kv_bytes_per_rank: int = 0       # the KV cache of one rank
    max_model_len: int = 0
    forward_calls: int = 0           # model forwards since start

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


# the engine-wide figures besides the pool and requests (recordings keep them as "extra")
RUNTIME_FIELDS = ("peak_used_blocks", "backend", "tensor_parallel_size", "kv_bytes_per_rank",
                  "max_model_len", "forward_calls")

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
from engine.outputs import TokenLogprobs, TokenTrace

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
    budget: int = 0                 # max_num_batched_tokens it was planned under (0: not
    mode: str = ""                  # recorded), and its scheduling_mode
    blocks_to_host: int = 0         # the host tier's copies sent with it: blocks (and bytes,
    blocks_from_host: int = 0       # every rank's shard) offloaded or swapped out, and
    bytes_to_host: int = 0          # reloaded or swapped in
    bytes_from_host: int = 0
    spec_off: int = 0               # requests decoding when speculation was off for them
    #                                 (more than speculative_config.disable_by_batch_size)
    spec_drafted_per_pos: tuple[int, ...] = ()    # by draft position j: the verifies with
    spec_accepted_per_pos: tuple[int, ...] = ()   # a draft there, and those that accepted
    #                                 it (with every draft before it: vLLM's per position)


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
    spec_decode_steps_with_drafts: int = 0     # steps while speculating: with verify rows,
    spec_decode_steps_without_drafts: int = 0  # with decodes but no drafts, and of those
    spec_decode_steps_off: int = 0             # the ones disable_by_batch_size turned off
    grammar_compiles: int = 0     # structured outputs: grammars compiled (cache misses),
    grammar_steps: int = 0        # steps with a grammar mask, the mask rows filled,
    grammar_rows: int = 0         # and the host time filling them (docs/STRUCTURED_OUTPUTS.md)
    grammar_fill_us: int = 0
    # the host KV tier (docs/KV_TIERS.md): blocks copied each way (offloads and swap-outs
    # to the host; prefix reloads and swap-ins back), offloads dropped (every host block
    # held), host blocks evicted, prompt tokens served from the host tier (a part of
    # prefix_hit_tokens), and swap preemptions: out, back in, and fallen back to recompute
    kv_offload_blocks: int = 0
    kv_reload_blocks: int = 0
    kv_offload_dropped: int = 0
    host_evictions: int = 0
    host_prefix_hit_tokens: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    swap_fallbacks: int = 0
    kv_offload_us: int = 0      # time the copies to the host took (rank 0's copy stream:
    kv_reload_us: int = 0       # completed copies), and the copies back

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


@dataclass(frozen=True)
class GrammarView:
    """A constrained request's grammar (structured outputs, docs/STRUCTURED_OUTPUTS.md): its kind
    and state, and for a request that asked for logprobs its last step: how many tokens
    the grammar allowed, the model's own top choices (token, logprob, allowed), the token
    taken. state: "compiling" while it waits for its grammar."""
    kind: str                   # json, regex, choice, grammar, json_object
    state: str = ""             # "compiling", "in string", "expecting ':'", "complete", ...
    allowed: int = -1           # tokens allowed at its last step (-1: not traced)
    vocab: int = 0
    top: tuple[tuple[int, float, bool], ...] = ()
    token: int = -1             # the token taken at that step


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
    # the TTFT split (engine/request.py, vLLM's names): serving-clock times and counts
    scheduled_ts: float | None = None    # first scheduled (its first admission)
    last_chunk_ts: float | None = None   # its last prompt chunk scheduled
    prefill_chunks: int = 0          # chunks scheduled before its first token (all admissions)
    prefill_preemptions: int = 0     # preemptions before its first token
    grammar: GrammarView | None = None   # structured outputs: None for a free request
    host_cached_tokens: int = 0      # of cached_tokens: reloaded from the host tier
    swapped: bool = False            # preempted by swap: its KV waits in the host tier

    def chunks_total(self, budget: int) -> int:
        """Chunks this prefill takes at the given budget (done + still needed)."""
        left = max(0, self.prefill_target - self.computed_tokens)
        return self.chunks_done + math.ceil(left / max(1, budget))

    @property
    def queued_time(self) -> float | None:
        """First scheduled - arrival (vLLM's queued_time); None until scheduled."""
        return None if self.scheduled_ts is None else self.scheduled_ts - self.arrival_time

    def ttft_split(self) -> tuple[float, float, float] | None:
        return ttft_split(self.arrival_time, self.ttft, self.scheduled_ts, self.last_chunk_ts)


def ttft_split(arrival: float, ttft: float | None, scheduled_ts: float | None,
               last_chunk_ts: float | None) -> tuple[float, float, float] | None:
    """TTFT in three parts that add up to it: queued (arrival to first scheduled: vLLM's
    queued_time), prefill (first scheduled to its last prompt chunk's scheduling: the
    earlier chunks, the waits between them, a preemption's requeue and recompute), and
    the last chunk's step until the first token is emitted (that chunk's logits give the
    token: no separate decode step; prefill + this part is vLLM's prefill_time). A dedup
    follower computes no chunk: its prefill part runs to its first token (the leader's
    prefill) and the last part is 0. None before the first token."""
    if ttft is None or scheduled_ts is None:
        return None
    queued = scheduled_ts - arrival
    if last_chunk_ts is None:
        return queued, ttft - queued, 0.0
    before = last_chunk_ts - scheduled_ts
    return queued, before, ttft - queued - before


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
    spec_method: str = ""            # speculative_config.method (the live k is in knobs)
    spec_disable_by_batch_size: int = 0   # speculative_config's (0: never off)
    logprobs_mode: str = ""          # what requests' logprobs hold (EngineConfig)
    recent_ttft_parts: tuple[tuple[float, float, float, float], ...] = ()   # (last token
    #     time, queued, prefill, last chunk to first token) of finished requests (TTFT split)
    traces: tuple[TokenTrace, ...] = ()      # the latest finished requests' token traces
    kv_cache_dtype: str = "auto"     # EngineConfig.kv_cache_dtype (auto: the model's dtype)
    # the host KV tier (kv_offloading_size; empty arrays without one): its blocks' states
    # and refcounts (a swapped-out request's blocks are used), and the bytes of a block;
    # arrays, so not part of == (compare block arrays with numpy)
    host_block_state: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int8), compare=False)
    host_block_refcount: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.uint8), compare=False)
    kv_bytes_per_block: int = 0      # every rank's shard: a step's bytes moved = blocks x this

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

    @property
    def host_num_blocks(self) -> int:
        return int(self.host_block_state.shape[0])

    @property
    def spec_pause(self) -> str:
        """Why the last step proposed no drafts while speculation is on, "" if it did not
        stop it: "speculation off: 256 decoding > disable_by_batch_size 32"."""
        off = self.last_step.spec_off if self.last_step is not None else 0
        if not off or not self.knobs.num_speculative_tokens:
            return ""
        return f"speculation off: {off} decoding > disable_by_batch_size " \
               f"{self.spec_disable_by_batch_size}"

    def request(self, request_id: str) -> RequestView | None:
        return next((r for r in self.requests if r.request_id == request_id), None)

    def trace(self, request_id: str) -> TokenTrace | None:
        return next((t for t in self.traces if t.request_id == request_id), None)


# the engine-wide figures besides the pool and requests (recordings keep them as "extra")
RUNTIME_FIELDS = ("peak_used_blocks", "backend", "tensor_parallel_size", "kv_bytes_per_rank",
                  "max_model_len", "forward_calls", "spec_method", "logprobs_mode",
                  "kv_cache_dtype", "spec_disable_by_batch_size")

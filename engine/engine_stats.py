"""EngineStats: the gauges and counters the core sends every client (the schema; the core's
engine/core/stats.py builds it)."""
from __future__ import annotations

import msgspec

from engine.kv_metrics import Histogram, KVBlockMetrics

# vLLM's vllm:iteration_tokens_total buckets (tokens in one engine step)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# vLLM's transfer_type label values of the kv_offload metrics, in the order of the
# two-entry fields below
TRANSFER_TYPES = ("GPU_to_CPU", "CPU_to_GPU")


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
    # speculative decoding (vLLM's spec_decode counters; docs/SPECULATIVE.md)
    spec_decode_num_drafts: int = 0            # requests verified with drafts, per step
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()   # by draft position
    spec_draft_num_used_blocks: int = 0        # the draft model's own KV pool (draft_model)
    spec_draft_faults: int = 0                 # proposals whose draft forward raised
    spec_draft_disabled: bool = False          # the draft turned off after faults in a row
    kv_events_seq: int = -1            # the last KV event batch's sequence number (-1:
    #                                    none, or events off): a router's index that has
    #                                    applied it knows all the engine did until then
    # the host KV tier (kv_offloading_size; docs/KV_TIERS.md), by TRANSFER_TYPES: bytes
    # copied, seconds the copies took, and the bytes of each step's copy (histograms)
    host_num_blocks: int = 0                   # 0: no host tier
    host_num_used_blocks: int = 0              # swapped-out requests' blocks
    kv_offload_bytes: tuple[int, int] = (0, 0)
    kv_offload_seconds: tuple[float, float] = (0.0, 0.0)
    kv_offload_sizes: tuple[Histogram, ...] = ()
    # tokens of each step: prompt tokens computed + tokens emitted (vLLM's
    # iteration_tokens_total; vLLM counts a prompt once, in its first token's step)
    iteration_tokens: Histogram = msgspec.field(default_factory=lambda: Histogram(
        ITERATION_TOKENS_BUCKETS, (0,) * (len(ITERATION_TOKENS_BUCKETS) + 1)))

"""The data-parallel front's merged view of its replicas with host KV tiers: the tiers'
per-transfer-type figures sum element-wise (bytes, seconds, size histograms) and their
host pools sit side by side in the merged snapshot, as the device pools do."""
import numpy as np

from engine.config import SchedulerConfig
from engine.core.kv.host_tier import TRANSFER_SIZE_BUCKETS
from engine.engine_stats import ITERATION_TOKENS_BUCKETS, EngineStats
from engine.front.dp_views import merge_snapshots, stats_sum
from engine.kv_metrics import Histogram
from engine.snapshot import EngineCounters, EngineSnapshot


def sizes(out: int, back: int) -> tuple[Histogram, Histogram]:
    n = len(TRANSFER_SIZE_BUCKETS) + 1
    return tuple(Histogram(TRANSFER_SIZE_BUCKETS, (c,) + (0,) * (n - 1), c * 1e5, c)
                 for c in (out, back))


def test_host_tier_stats_sum_per_transfer_type():
    a = EngineStats(host_num_blocks=8, host_num_used_blocks=2, kv_offload_bytes=(100, 10),
                    kv_offload_seconds=(0.5, 0.25), kv_offload_sizes=sizes(3, 1),
                    spec_decode_num_accepted_tokens_per_pos=(1, 2))
    b = EngineStats(host_num_blocks=8, host_num_used_blocks=1, kv_offload_bytes=(50, 5),
                    kv_offload_seconds=(0.25, 0.5), kv_offload_sizes=sizes(2, 4),
                    spec_decode_num_accepted_tokens_per_pos=(3, 4))
    s = stats_sum([a, b])
    assert (s.host_num_blocks, s.host_num_used_blocks) == (16, 3)
    assert s.kv_offload_bytes == (150, 15) and s.kv_offload_seconds == (0.75, 0.75)
    assert [h.count for h in s.kv_offload_sizes] == [5, 5]
    assert [h.counts[0] for h in s.kv_offload_sizes] == [5, 5]
    assert s.spec_decode_num_accepted_tokens_per_pos == (4, 6)


def test_iteration_tokens_sum_over_replicas():
    """vllm:iteration_tokens_total of a data-parallel front's summed stats: every
    replica's steps, bucket by bucket."""
    def stats(counts, total):
        return EngineStats(iteration_tokens=Histogram(
            ITERATION_TOKENS_BUCKETS, counts + (0,) * (len(ITERATION_TOKENS_BUCKETS) + 1
                                                       - len(counts)), total, sum(counts)))
    s = stats_sum([stats((2, 1), 12.0), stats((0, 3), 21.0)])
    assert s.iteration_tokens.counts[:3] == (2, 4, 0)
    assert (s.iteration_tokens.count, s.iteration_tokens.sum) == (6, 33.0)
    assert s.iteration_tokens.buckets == ITERATION_TOKENS_BUCKETS


def test_without_host_tiers_the_sum_keeps_the_defaults():
    s = stats_sum([EngineStats(), EngineStats()])
    assert s.kv_offload_bytes == (0, 0) and s.kv_offload_sizes == () and s.host_num_blocks == 0


def test_merged_snapshot_puts_the_host_pools_side_by_side():
    def snap(n, host):
        return EngineSnapshot(time=0.0, step=0, model="m", device="cpu", dtype="float32",
                              knobs=SchedulerConfig(), paused=False, num_blocks=n,
                              block_size=4, block_state=np.zeros(n, np.int8),
                              block_refcount=np.zeros(n, np.int32), requests=(),
                              last_step=None, recent_steps=(), counters=EngineCounters(),
                              host_block_state=np.full(host, host, np.int8),
                              host_block_refcount=np.full(host, 1, np.uint8))
    merged = merge_snapshots([snap(4, 2), snap(4, 3)])
    assert merged.host_block_state.tolist() == [2, 2, 3, 3, 3]
    assert merged.host_block_refcount.tolist() == [1] * 5
    assert merged.num_blocks == 8

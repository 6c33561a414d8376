"""The data-parallel front's one view of its replicas: their snapshots merged (the KV
pools side by side, block numbers of replica r offset by the blocks before it; the host
tiers' pools side by side too) and their stats summed, so that a bench, a TUI or /metrics reading a single engine reads N."""
from __future__ import annotations

import dataclasses

import msgspec
import numpy as np

from engine.engine_stats import EngineStats
from engine.kv_metrics import BLOCK_METRICS, Histogram, KVBlockMetrics
from engine.snapshot import EngineCounters, EngineSnapshot

RECENT = 256      # steps, events and latency samples a merged view keeps (the newest)


def _hist_sum(hs: list[Histogram]) -> Histogram:
    return Histogram(hs[0].buckets, tuple(map(sum, zip(*(h.counts for h in hs)))),
                     sum(h.sum for h in hs), sum(h.count for h in hs))


def block_metrics_sum(ms: list[KVBlockMetrics]) -> KVBlockMetrics:
    return KVBlockMetrics(*(_hist_sum([getattr(m, n) for m in ms]) for n in BLOCK_METRICS))


def counters_sum(cs: list[EngineCounters]) -> EngineCounters:
    return EngineCounters(**{f.name: sum(getattr(c, f.name) for c in cs)
                             for f in dataclasses.fields(EngineCounters)})


def stats_sum(stats: list[EngineStats]) -> EngineStats:
    """Counts and gauges summed; the time the latest; flags any."""
    out = {}
    for name in EngineStats.__struct_fields__:
        values = [getattr(s, name) for s in stats]
        if name == "time":
            out[name] = max(values)
        elif name == "kv_block_metrics":
            out[name] = block_metrics_sum(values)
        elif isinstance(values[0], Histogram):     # iteration_tokens
            out[name] = _hist_sum(values)
        elif name == "kv_offload_sizes":      # a histogram per transfer type
            out[name] = tuple(map(_hist_sum, zip(*values))) if all(values) else values[0]
        elif isinstance(values[0], tuple):       # per position, per transfer type
            out[name] = tuple(map(sum, zip(*values))) if all(values) else values[0]
        elif name == "kv_events_seq":
            out[name] = -1          # per replica only (DPClient.replica_stats)
        elif isinstance(values[0], bool):
            out[name] = any(values)
        else:
            out[name] = sum(values)
    return msgspec.structs.replace(stats[0], **out)


def _newest(groups, key) -> tuple:
    return tuple(sorted((x for g in groups for x in g), key=key)[-RECENT:])


def merge_snapshots(snaps: list[EngineSnapshot]) -> EngineSnapshot:
    """One snapshot of N replicas (replica r's blocks numbered after replicas 0..r-1)."""
    if len(snaps) == 1:
        return snaps[0]
    offsets = np.cumsum([0] + [s.num_blocks for s in snaps[:-1]]).tolist()
    requests = []
    for snap, off in zip(snaps, offsets):
        for r in snap.requests:
            requests.append(dataclasses.replace(r, blocks=tuple(b + off for b in r.blocks))
                            if off and r.blocks else r)
    requests.sort(key=lambda r: r.arrival_time)
    steps = _newest([s.recent_steps for s in snaps], key=lambda s: s.wall_time)
    counters = counters_sum([s.counters for s in snaps])
    return dataclasses.replace(
        snaps[0], step=counters.steps, counters=counters,
        num_blocks=sum(s.num_blocks for s in snaps),
        block_state=np.concatenate([s.block_state for s in snaps]),
        block_refcount=np.concatenate([s.block_refcount for s in snaps]),
        host_block_state=np.concatenate([s.host_block_state for s in snaps]),
        host_block_refcount=np.concatenate([s.host_block_refcount for s in snaps]),
        requests=tuple(requests), recent_steps=steps,
        last_step=steps[-1] if steps else None,
        recent_latencies=_newest([s.recent_latencies for s in snaps], key=lambda x: x[0]),
        recent_itls=_newest([s.recent_itls for s in snaps], key=lambda x: x[0]),
        recent_ttft_parts=_newest([s.recent_ttft_parts for s in snaps], key=lambda x: x[0]),
        events=_newest([[dataclasses.replace(e, blocks=tuple(b + off for b in e.blocks))
                          for e in s.events] for s, off in zip(snaps, offsets)],
                       key=lambda e: e.time),
        kv_block_metrics=block_metrics_sum([s.kv_block_metrics for s in snaps]),
        peak_used_blocks=sum(s.peak_used_blocks for s in snaps),
        forward_calls=sum(s.forward_calls for s in snaps),
        traces=tuple(t for s in snaps for t in s.traces),
        error=next((s.error for s in snaps if s.error), None),
        paused=any(s.paused for s in snaps))

"""Builders of the UI views (engine/snapshot.py) from the core's live objects: run on the
engine thread, after a step."""
from __future__ import annotations

import numpy as np

from engine.codes import (CANCELLED, COMPILING, DECODING, DEDUP, ERROR, FINISHED, PREEMPTED,
                          PREFILLING, WAITING)
from engine.metrics import request_latencies
from engine.request import Request, RequestStatus
from engine.snapshot import OUTPUT_TAIL, EngineSnapshot, GrammarView, RequestView


def compact_counts(counts: np.ndarray) -> np.ndarray:
    """A copy in the smallest unsigned dtype that holds it: refcounts are nearly all 0-1,
    and a full pool's int32 array is most of a snapshot's bytes (viewers read values)."""
    top = int(counts.max(initial=0))
    dtype = np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else counts.dtype
    return counts.astype(dtype)


_ENDED = {RequestStatus.FINISHED: FINISHED, RequestStatus.CANCELLED: CANCELLED,
          RequestStatus.ERROR: ERROR}


def request_state(req: Request) -> str:
    st = req.status
    if st is RequestStatus.WAITING:
        if req.grammar is not None and not req.grammar.ready:
            return COMPILING
        return PREEMPTED if req.num_preemptions else WAITING
    if st is RequestStatus.RUNNING:
        if req.dedup_leader is not None:
            return DEDUP
        return PREFILLING if req.num_uncomputed > 1 else DECODING
    return _ENDED[st]


def request_view(req: Request) -> RequestView:
    ttft, tpot, itl = request_latencies(req.arrival_time, req.token_times)
    preview = req.prompt[:80] if req.prompt is not None else f"<{req.num_prompt_tokens} token ids>"
    return RequestView(req.request_id, request_state(req), req.arrival_time,
                       req.num_prompt_tokens, req.num_computed_tokens, req.num_prefill_target,
                       req.chunks_done, req.num_cached_tokens, len(req.output_token_ids),
                       req.params.max_tokens, ttft, tpot, itl, tuple(req.block_table),
                       req.num_preemptions, preview, "", req.finish_reason, req.error,
                       tuple(req.output_token_ids[-OUTPUT_TAIL:]), req.priority,
                       req.num_draft_tokens, req.num_accepted_tokens, req.last_logprobs,
                       req.scheduled_ts, req.last_chunk_ts, req.prefill_chunks,
                       req.prefill_preemptions, _grammar_view(req),
                       req.num_host_cached_tokens, req.swap is not None)


def _grammar_view(req: Request) -> GrammarView | None:
    g = req.grammar
    if g is None:
        return None
    if g.view is not None:
        return g.view
    return GrammarView(g.params.kind, "" if g.ready or req.status.done else COMPILING)


def ended_views(engine) -> tuple:
    """The latest ended requests' views, then those of the latest traced ones that
    have left that window (engine/core/core.py RECENT_TRACED)."""
    recent, traced = _viewed(engine.recent_finished), engine.recent_traced
    if not traced:
        return recent
    shown = {v.request_id for v in recent}
    return recent + tuple(v for v in _viewed(traced) if v.request_id not in shown)


def _viewed(ended) -> tuple:
    """The views of a deque of ended requests, each built once, at the first snapshot
    that shows it (the deque keeps the view in the request's place): an ended request
    changes no more."""
    for i, item in enumerate(ended):
        if type(item) is Request:
            ended[i] = request_view(item)
    return tuple(ended)


def engine_snapshot(engine, paused: bool = False) -> EngineSnapshot:
    """An immutable view of an LLMEngine now (cheap: arrays copied, views built)."""
    st, pool, ex = engine.stats, engine.pool, engine.executor
    active = tuple(request_view(r) for r in engine.requests.values())
    return EngineSnapshot(
        time=engine.clock.now(), step=st.counters.steps, model=engine.model_name,
        device=str(ex.device), dtype=ex.dtype_name,
        knobs=engine.knobs, paused=paused, num_blocks=pool.num_blocks,
        block_size=pool.block_size, block_state=pool.states(),
        block_refcount=compact_counts(pool.refcounts),
        requests=active + ended_views(engine), last_step=st.last_step,
        recent_steps=tuple(st.recent_steps), counters=st.counters.freeze(),
        recent_latencies=tuple(st.recent_latencies), recent_itls=tuple(st.recent_itls),
        error=st.last_error, events=engine.events.recent(),
        kv_block_metrics=pool.lifetimes.freeze(),
        peak_used_blocks=st.peak_used_blocks, backend=engine.backend,
        tensor_parallel_size=engine.config.tensor_parallel_size,
        kv_bytes_per_rank=ex.kv_bytes_per_rank, max_model_len=engine.max_model_len,
        forward_calls=ex.forward_calls, spec_method=engine.spec.method,
        spec_disable_by_batch_size=engine.spec.disable_by_batch_size or 0,
        logprobs_mode=engine.config.logprobs_mode, kv_cache_dtype=engine.config.kv_cache_dtype,
        recent_ttft_parts=tuple(st.recent_ttft_parts), traces=st.traces(),
        **host_view(engine.host))


def host_view(host) -> dict:
    """The host tier's fields of a snapshot (none without a tier: the defaults)."""
    if host is None:
        return {}
    host.sync_times()
    return dict(host_block_state=host.pool.states(),
                host_block_refcount=compact_counts(host.pool.refcounts),
                kv_bytes_per_block=host.bytes_per_block)

"""Measure a guide's setup headless: the numbers its claim names, over a few seconds of
a live source (engine counters and latency samples of the snapshots, no UI).

`measure(source, seconds)` samples what the TUI's panels show: TTFT percentiles of the
requests whose first token came in the window, ITL percentiles of its token gaps, TPOT
p50 of the requests that finished in it, output tokens per second, the prefix hit rate,
preemptions, and the mean running / waiting counts and KV use.
tests/roseplay/test_guides_verified.py runs each guide's setup with it and checks the
direction its claim names.
"""
from __future__ import annotations

import math
import time

import numpy as np

from engine.metrics import prefix_hit_rate

SAMPLE_EVERY = 0.1      # seconds between snapshots read while measuring
WARMUP_STEPS = 20       # engine steps a setup runs before it is measured: a new workload's
#                         first prompts prefill together (96 of them: ~12 steps), and a
#                         loaded machine runs fewer steps per second (a fixed time is not
#                         enough there)
WARMUP_LIMIT = 20.0     # seconds: a setup that never runs that many steps is measured anyway


def _pct(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


def settle(source, warmup: float, steps: int = WARMUP_STEPS) -> None:
    """At least `warmup` s and `steps` engine steps."""
    start, deadline = source.snapshot().step, time.monotonic() + WARMUP_LIMIT
    time.sleep(warmup)
    while source.snapshot().step < start + steps and time.monotonic() < deadline:
        time.sleep(SAMPLE_EVERY)


def measure(source, seconds: float, warmup: float = 1.0) -> dict:
    """Let the setup settle (`warmup` s and WARMUP_STEPS steps), then read `seconds` of it."""
    settle(source, warmup)
    first = source.snapshot()
    running, waiting, used, waiting_len = [], [], [], []
    # TTFT of every request whose first token came in the window, running or finished
    # (finished ones alone would leave a slow setup with no sample at all)
    seen = {r.request_id for r in first.requests if r.ttft is not None}
    ttfts: dict[str, float] = {}
    chunks: dict[str, int] = {}       # prefill chunks of each request that got its first token
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(SAMPLE_EVERY)
        snap = source.snapshot()
        if snap.last_step is not None:
            running.append(snap.last_step.num_running)
            waiting.append(snap.last_step.num_waiting)
        used.append(snap.num_used / max(1, snap.num_blocks))
        waiting_len.extend(r.prompt_tokens for r in snap.requests if r.state == "waiting")
        chunks.update((r.request_id, r.chunks_done) for r in snap.requests
                      if r.ttft is not None and r.request_id not in seen)
        ttfts.update((r.request_id, r.ttft) for r in snap.requests
                     if r.ttft is not None and r.request_id not in seen
                     and r.state not in ("cancelled", "error"))
    last = source.snapshot()
    t0, t1 = first.time, last.time
    a, b = first.counters, last.counters
    # a request still waiting for its first token at the end counts with its age so far
    # (a lower bound): without it a setup that delays long prompts past the window would
    # look fast, its slowest requests left out
    ttft = list(ttfts.values()) + [
        last.time - r.arrival_time for r in last.requests
        if r.ttft is None and r.state in ("waiting", "prefilling", "preempted")
        and r.arrival_time >= first.time and r.request_id not in ttfts]
    steps = [s for s in last.recent_steps if s.step > first.step]
    itl = [g for t, g in last.recent_itls if t0 < t <= t1]
    # TPOT of the requests that finished in the window (the Timing panel's TPOT row): a
    # verify's tokens arrive together, so ITL's p50 is 0 there while TPOT is per token
    tpot = [x[2] for x in last.recent_latencies if t0 < x[0] <= t1 and x[2] is not None]
    return dict(
        seconds=t1 - t0, finished=b.finished - a.finished,
        tok_s=(b.generated_tokens - a.generated_tokens) / max(t1 - t0, 1e-9),
        ttft_p50=_pct(ttft, 50), ttft_p90=_pct(ttft, 90),
        chunks_p90=_pct(list(chunks.values()), 90),
        # what the queue holds: a priority policy leaves the long low-priority documents
        waiting_prompt_len=float(np.mean(waiting_len)) if waiting_len else 0.0,
        itl_p50=_pct(itl, 50), itl_p99=_pct(itl, 99), tpot_p50=_pct(tpot, 50),
        hit_rate=prefix_hit_rate(b.prefix_hit_tokens - a.prefix_hit_tokens,
                                 b.prefix_queried_tokens - a.prefix_queried_tokens) or 0.0,
        preemptions=b.preemptions - a.preemptions, evictions=b.evictions - a.evictions,
        running=float(np.mean(running)) if running else 0.0,
        waiting=float(np.mean(waiting)) if waiting else 0.0,
        kv_used=float(np.mean(used)) if used else 0.0,
        # steps that ran decodes and prefill chunks together (budget, mixed-chunk modes)
        mixed_steps=sum(bool(s.decode_tokens and s.prefill_tokens) for s in steps)
        / max(1, len(steps)),
        # speculative decoding: acceptance 0 and a length of 1 (one token per decode)
        # when no request was verified with drafts
        spec_acceptance=_or(b.spec_acceptance(a)[0], 0.0),
        spec_mean_accepted_len=_or(b.spec_acceptance(a)[1], 1.0))


def wait_for_evictions(source, timeout: float) -> bool:
    """Wait until the pool evicts (a claim about eviction needs a full pool); False if it
    did not within `timeout` s."""
    start = source.snapshot().counters.evictions
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if source.snapshot().counters.evictions > start:
            return True
        time.sleep(SAMPLE_EVERY)
    return False


def run_setup(source, guide, seconds: float, warmup: float = 1.0) -> dict:
    """Apply `guide` (its whole setup) to a live source and measure it."""
    from roseplay.guides import apply_guide
    apply_guide(source, guide)
    return measure(source, seconds, warmup)

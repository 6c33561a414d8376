"""Overlapped decode steps (async scheduling).

While decode step N runs on the device, the host commits N's KV bookkeeping, builds
step N+1 for the same requests, and launches it with N's sampled tokens as input
straight from device memory; only then does it wait for N's tokens. The host work of
one step thus hides behind the device work of the next.

A step is chained only in the steady state: a decode-only step on the static decode
path, every running request in it, no admission pending, budget for all of them. A
request that will finish by length is left out; one that stops on EOS or a stop string
has one extra token computed and thrown away (its KV write lands in a block it still
holds at launch time, freed afterwards).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.device_io import HostCopy, to_device
from engine.request import Request, RequestStatus
from engine.scheduler import ScheduledChunk, StepPlan


@dataclass
class Launched:
    """A step whose forward and sampling are queued on the device."""
    plan: StepPlan
    requests: list[Request]          # one per sampled token, in row order
    tokens: torch.Tensor             # device tensor of sampled tokens (feeds the next step)
    host_tokens: HostCopy            # the same tokens on their way to the host
    t0: float
    evictions0: int


def chainable(engine, plan: StepPlan) -> bool:
    """May this plan start (or continue) an overlapped chain?"""
    return (engine.allow_chain and engine.config.async_scheduling and not plan.prefills
            and not plan.preempted and engine.runner.static_decode(plan))


def next_plan(engine, prev: Launched) -> tuple[StepPlan, torch.Tensor] | None:
    """The decode step that follows `prev` (already committed), with its input tokens
    as a device tensor, or None if the chain must break."""
    sched, knobs = engine.scheduler, engine.knobs
    if sched.waiting and len(sched.running) < knobs.max_num_seqs:
        return None                                  # admissions pending
    if len(prev.plan.decodes) != len(sched.running) or len(sched.running) > knobs.max_num_batched_tokens:
        return None                                  # someone else needs the step
    plan, rows = StepPlan(), []
    for i, c in enumerate(prev.plan.decodes):
        r = c.request
        if r.status is not RequestStatus.RUNNING:
            continue
        if (len(r.output_token_ids) + 1 >= r.params.max_tokens
                or r.num_tokens + 1 >= engine.max_model_len):
            continue                                 # prev's token finishes it
        if not sched.kv.reserve_one(r, plan.copies):
            return None                              # pool dry: let the scheduler preempt
        plan.decodes.append(ScheduledChunk(r, r.num_computed_tokens, 1, True))
        rows.append(i)
    if not plan.decodes or not chainable(engine, plan):
        return None
    tokens = prev.tokens
    if len(rows) != tokens.shape[0]:
        tokens = tokens.index_select(0, to_device(rows, torch.int64, tokens.device))
    return plan, tokens


def launch(engine, plan: StepPlan, token_source: torch.Tensor | None = None) -> Launched:
    t0, ev0 = time.perf_counter(), engine.pool.evictions
    logits, sample_chunks = engine.runner.execute(plan, token_source)
    rows, reqs = [], []
    for i, c in enumerate(sample_chunks):
        rows.append(i)
        reqs.append(c.request)
        for f in engine.scheduler.followers.get(c.request, ()):
            rows.append(i)      # followers sample from their leader's row
            reqs.append(f)
    if len(rows) != logits.shape[0]:
        logits = logits.index_select(0, to_device(rows, torch.int64, logits.device))
    tokens = engine.sampler.sample_async(logits, reqs)
    # start the copy to the host now: a later .tolist() would be ordered behind (and wait
    # for) the next step, which is launched before these tokens are read
    return Launched(plan, reqs, tokens, HostCopy(tokens), t0, ev0)

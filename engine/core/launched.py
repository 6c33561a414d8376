"""A launched step (`Launched`: its plan, batch, rows and the copies of its results on
their way to the host) and the commit of its KV bookkeeping once computed
(`commit_plan`): the two halves of a step around its device work, used by the core
(engine/core/core.py)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.step_plan import StepPlan
from engine.request import PENDING_TOKEN, Request, RequestStatus
from engine.worker.device_io import HostCopy
from engine.worker.step_batch import StepBatch


@dataclass
class Launched:
    """A step whose forward and sampling are queued on the device."""
    plan: StepPlan
    batch: StepBatch
    requests: list[Request]          # one per sample row
    admits: list[int]                # each row's request's admit_seq at launch: a row
    #                                  is void for a request re-admitted since
    host_tokens: HostCopy | None     # the same tokens on their way to the host (None:
    #                                  sampled later, when its grammar mask is filled)
    t0: float
    logprobs: object = None          # LogprobsCopy of the rows that asked (engine/worker/sampling.py)
    prompt_logprobs: object = None   # PromptLogprobsCopy (engine/core/prompt_logprobs.py)
    grammar: object = None           # its constrained rows (structured manager's StepMask)



def commit_plan(plan: StepPlan, scheduler, page: int, caching: bool,
                rows: list[Request] | None = None) -> bool:
    """The plan's KV is computed: advance counters, index newly full blocks, and let
    dedup followers take the blocks of leaders that finished their prompt.

    rows (async scheduling, the next step launched before this one's tokens are read):
    the requests of the plan's sample rows. A plan of decodes alone, row i sampling
    decode i (no dedup follower rows), then also counts each decode's token as pending
    in the same pass (request.add_pending_tokens: one walk over the wide step instead of
    two), and tells the scheduler when every decode still running did (the rows of
    those that ended since the launch left out). Returns whether it did (else the
    caller adds them)."""
    running = RequestStatus.RUNNING
    kv = scheduler.kv
    pend = rows is not None and not plan.prefills and not plan.verifies \
        and len(rows) == len(plan.decodes)
    if pend:
        marked, gone = 0, []
        for row, c in enumerate(plan.decodes):    # the steady async decode step
            req = c.request
            if req.status is running:
                n = req.num_computed_tokens = req.num_computed_tokens + 1
                if n % page == 0:
                    kv.register_full_blocks(req, caching)
                if req.pending_row < 0:
                    req.output_token_ids.append(PENDING_TOKEN)
                    req.pending_row = row
                    marked += 1
            else:      # ended since the launch (a stop token, a cancel): its row is void
                gone.append(row)
        if marked + len(gone) == len(plan.decodes):     # every running decode again, one
            scheduler.decodes_pending(plan, gone)         # further (the scheduler)
    else:
        for c in plan.decodes:   # one token each; a block fills every `page`
            req = c.request
            if req.status is running:
                n = req.num_computed_tokens = req.num_computed_tokens + 1
                if n % page == 0:
                    kv.register_full_blocks(req, caching)
    for c in plan.prefills:
        req = c.request
        if req.status.done:
            continue
        req.num_computed_tokens += c.num_tokens
        req.chunks_done += 1
        kv.register_full_blocks(req, caching)
        if c.sample:
            scheduler.leader_sampled(req)
    followers = scheduler.followers
    if followers:      # a leader whose last prompt token ran as a decode sampled too
        for c in plan.decodes:
            if c.request in followers and c.request.status is running:
                scheduler.leader_sampled(c.request)
    return pend

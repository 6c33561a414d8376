"""A launched step (`Launched`: its plan, batch, rows and the copies of its results on
their way to the host) and the commit of its KV bookkeeping once computed
(`commit_plan`): the two halves of a step around its device work, used by the core
(engine/core/core.py)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.step_plan import StepPlan
from engine.request import PENDING_TOKEN, Request, RequestStatus, add_pending_tokens
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
    logprobs: object = None          # LogprobsCopy of the rows that asked (engine/worker/logprobs.py)
    prompt_logprobs: object = None   # PromptLogprobsCopy (engine/core/prompt_logprobs.py)
    grammar: object = None           # its constrained rows (structured manager's StepMask)



def commit_plan(plan: StepPlan, scheduler, page: int, caching: bool,
                rows: list[Request] | None = None) -> bool:
    """The plan's KV is computed: advance counters, index newly full blocks, and let
    dedup followers take the blocks of leaders that finished their prompt.

    rows (async scheduling, the next step launched before this one's tokens are read):
    the requests of the plan's sample rows. A plan whose rows are its decodes (row i
    samples decode i) and then its prefill chunks that sample (no dedup follower rows)
    also counts each row's token as pending here (request.add_pending_tokens: one walk
    over the wide step instead of two), and tells the scheduler when every decode still
    running did and every chunk finished its prompt (`decodes_pending`: the rows of
    requests that ended since the launch, and the prompts' rows, which decode next).
    Returns whether it did (else the caller adds them)."""
    running = RequestStatus.RUNNING
    kv = scheduler.kv
    decodes, prefills = plan.decodes, plan.prefills
    pend = rows is not None and not plan.verifies and len(rows) == len(decodes) + (
        sum([c.sample for c in prefills]) if prefills else 0)
    if pend:
        marked, gone = 0, []
        for row, c in enumerate(decodes):    # the steady async decode step
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
    else:
        for c in decodes:   # one token each; a block fills every `page`
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
    if pend:      # the rows of prompts it finished, after the decodes' rows
        d = len(decodes)
        if add_pending_tokens(rows, d) == len(prefills) and marked + len(gone) == d:
            # every one decodes next (the prompts' requests from their rows)
            scheduler.decodes_pending(plan, gone, list(enumerate(rows[d:], d)))
    return pend

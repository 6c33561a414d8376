"""Speculative decoding on the core's side (docs/SPECULATIVE.md): drafts in, accepted
tokens out.

`SpecDecoder.schedule_drafts` is the scheduler's drafter: after the step's decodes got
their one token each, every eligible decode gets up to k drafts from its Proposer
(vLLM's n-gram prompt lookup, engine/core/ngram_proposer.py, or a draft model,
engine/core/draft_proposer.py; one batched call for the step's eligible decodes) from
what is left of the token budget, and becomes a VerifyChunk: its last token and the drafts,
each a decode row of the step (engine/core/batch_builder.py), every position sampled.
`commit` reads the sampled tokens: the longest
prefix of drafts equal to the target's tokens is accepted, plus the target's token after
it; the request's computed count moves past the accepted tokens only, and blocks that
hold nothing but rejected slots go back to the pool (no unverified token is ever hashed
into the prefix cache: blocks are hashed from computed tokens).

Not speculated (a plain decode instead): requests whose sampling needs the processed
path (penalties, logit bias, min_p, min_tokens, logprobs) and a request with a token
still pending on the device. A constrained request's draft is cut to the prefix its
grammar accepts (structured outputs, docs/STRUCTURED_OUTPUTS.md), checked without advancing it. Seeded random requests are: their rows draw from their own
generator (engine/worker/rejection.py).
"""
from __future__ import annotations

from itertools import repeat
from typing import Protocol

from engine.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from engine.core.draft_proposer import DraftProposer
from engine.core.ngram_proposer import NgramProposer
from engine.core.step_plan import StepPlan, VerifyChunk
from engine.codes import REASON_LENGTH, REASON_STOP
from engine.request import TRACE_TOKENS, RequestStatus


def _until_end(req, tokens: list[int]) -> list[int]:
    """The tokens up to the first that ends the request (a stop token, its length cap)."""
    room = req.length_cap - req.num_tokens
    stops = req.stop_ids
    if room < len(tokens):
        tokens = tokens[:max(room, 1)]
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[:i + 1]
    return tokens


def append_verified(req, new: list[int], now: float, itls, out) -> str | None:
    """engine/request.py append_sampled for one verified request's new tokens (cut at its
    end by _until_end, so only the last can end it): all emitted at `now` (inter-token
    gaps of 0 after the first), appended at once. Returns why the request ends, if it
    does."""
    n, times = len(new), req.token_times
    if times:
        itls.append((now, now - times[-1]))
    if n > 1:
        itls.extend(repeat((now, 0.0), n - 1))
    times.extend(repeat(now, n))
    req.output_token_ids.extend(new)
    out.request_ids.extend(repeat(req.request_id, n))
    out.token_ids.extend(new)
    if out.logprobs is not None:     # another request of the step asked for logprobs
        out.logprobs.extend(repeat(None, n))
    if new[-1] in req.stop_ids:
        return REASON_STOP
    if len(req.prompt_token_ids) + len(req.output_token_ids) >= req.length_cap:
        return REASON_LENGTH
    return None


class Proposer(Protocol):
    """Where drafts come from: the method's (ngram, draft_model), or one handed to
    LLMEngine / LLM as `proposer=` (the Python API's extension point, e.g. the
    benchmarks' oracle, benchmarks/oracle.py; docs/SPECULATIVE.md "Proposers")."""

    method: str      # the name snapshots show (EngineSnapshot.spec_method)

    def propose(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] draft token ids for each running request (engine.request.Request:
        read its prompt_token_ids, output_token_ids, request_id; change nothing)."""

    def release(self, request_id: str) -> None:
        """The request ended: drop what is kept for it."""


def make_proposer(config: SpeculativeConfig, draft_runner) -> Proposer:
    """The method's proposer: the draft model over the executor's draft runner
    (draft_model), else n-gram prompt lookup."""
    if draft_runner is not None:
        return DraftProposer(draft_runner)
    return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)


# Async scheduling with speculation (docs/SPECULATIVE.md "Async scheduling"): steps that
# verify nothing may run ahead of their tokens, at most this many in a row; a request the
# proposer found no draft for is not waited for during as many steps.
SPEC_ASYNC_RUN = 4


def step_positions(verifies: list[VerifyChunk]) -> tuple[list[int], list[int]]:
    """At each draft position j of a step's verifies (their `accepted` set): those with
    a draft there, and those that accepted it (every draft up to j)."""
    drafted = [0] * max(len(v.draft) for v in verifies)
    accepted = drafted.copy()
    for v in verifies:
        for j in range(len(v.draft)):
            drafted[j] += 1
        for j in range(v.accepted):
            accepted[j] += 1
    return drafted, accepted


class SpecDecoder:
    def __init__(self, proposer: Proposer, scheduler, counters,
                 disable_by_batch_size: int | None = None):
        self.proposer = proposer
        # more decodes than this in a step: no drafts (SpeculativeConfig; None: never)
        self.disable_by_batch_size = disable_by_batch_size
        self.method = proposer.method
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.counters = counters
        # accepted drafts by position (vLLM's spec_decode_num_accepted_tokens_per_pos)
        self.accepted_per_pos = [0] * MAX_SPECULATIVE_TOKENS
        self.longest_draft = 0        # positions reported (a position never drafted: none)
        # structured outputs: (request, draft) -> the prefix its grammar accepts (the
        # engine's StructuredOutputManager.validate_drafts; the matcher does not advance)
        self.check_drafts = lambda req, draft: draft

    @property
    def draft(self) -> DraftProposer | None:
        """The draft model's proposer (its blocks and faults are reported), else None."""
        return self.proposer if isinstance(self.proposer, DraftProposer) else None

    def release(self, request_id: str) -> None:
        self.proposer.release(request_id)

    def draft_used_blocks(self) -> int:
        return self.draft.num_used_blocks if self.draft is not None else 0

    def schedule_drafts(self, plan: StepPlan, budget: int) -> int:
        """Turn scheduled decodes into VerifyChunks, each draft costing one token of the
        budget; returns the budget left. The eligible decodes are proposed for in one
        batch (room: k, the budget, the length cap), then take their drafts in order,
        each cut to the budget left. Where the pool has no room for the drafts' slots
        the decode stays plain (speculation never preempts). With more decodes than
        disable_by_batch_size the step proposes nothing: a plain decode step."""
        off = self.disable_by_batch_size
        if off is not None and len(plan.decodes) > off:
            plan.spec_off = len(plan.decodes)
            self.counters.spec_decode_steps_off += 1
            self.counters.spec_decode_steps_without_drafts += 1
            return budget
        budget = self._draft(plan, budget)
        if plan.verifies:
            self.counters.spec_decode_steps_with_drafts += 1
        else:
            self.counters.spec_decode_steps_without_drafts += 1
        return budget

    def _draft(self, plan: StepPlan, budget: int) -> int:
        """schedule_drafts' proposals and reservations (the off-switch passed)."""
        k = self.scheduler.knobs.num_speculative_tokens
        cap, running = min(k, budget), RequestStatus.RUNNING
        chunks, rooms = [], []
        followers = self.scheduler.followers
        for c in plan.decodes:
            req = c.request
            # a dedup leader at its last prompt token: its followers sample from its row
            if req.processed or req.status is not running or req in followers:
                continue
            room = req.length_cap - len(req.prompt_token_ids) - len(req.output_token_ids) - 1
            if room > cap:
                room = cap
            if room <= 0:
                continue
            if req.pending_row >= 0:       # its last token is still on the device
                if req.spec_quiet > 0:
                    req.spec_quiet -= 1
                else:
                    plan.spec_waiting = True
                continue
            chunks.append(c)
            rooms.append(room)
        if not chunks:
            return budget
        verified = set()
        reserve, verifies, copies = self.kv.reserve, plan.verifies, plan.copies
        for c, draft in zip(chunks, self.proposer.propose([c.request for c in chunks], rooms)):
            if c.request.grammar is not None:
                draft = self.check_drafts(c.request, draft)
            if len(draft) > budget:
                draft = draft[:budget]
            if not draft:
                c.request.spec_quiet = SPEC_ASYNC_RUN
            elif reserve(c.request, 1 + len(draft), copies):
                verifies.append(VerifyChunk(c.request, c.start, draft))
                budget -= len(draft)
                verified.add(id(c))
        plan.decodes = [c for c in plan.decodes if id(c) not in verified]
        return budget

    def commit(self, plan: StepPlan, tokens: list[int], now: float, itls, out,
               caching: bool) -> list:
        """The verify chunks' sampled tokens (1 + drafts each, in order) into their
        requests; returns the requests a token ends, with the reason. One pass a request,
        none a token: its accepted tokens and the target's next arrive at one time, so
        they enter the request together (append_verified)."""
        verifies = plan.verifies
        plan.spec_positions = self._count_accepted(verifies, tokens)
        running = RequestStatus.RUNNING
        ended, live, row = [], [], 0
        for chunk in verifies:
            req, d, a = chunk.request, chunk.num_tokens - 1, chunk.accepted
            req.num_draft_tokens += d
            req.num_accepted_tokens += a
            if req.status is running:
                new = tokens[row:row + a + 1]
                # the common case (no stop token, room for all) without a call
                if req.length_cap - len(req.prompt_token_ids) - len(req.output_token_ids) \
                        <= a or not req.stop_ids.isdisjoint(new):
                    new = _until_end(req, new)
                first = len(req.output_token_ids)      # the TUI's token trace (stats.py)
                if first < TRACE_TOKENS:
                    req.spec_trace.append((first, len(new), d, a))
                reason = append_verified(req, new, now, itls, out)
                if reason is not None:
                    ended.append((req, reason))
                live.append((chunk, len(new)))
            row += d + 1
        kv, bs = self.kv, self.kv.block_size
        for chunk, n in live:      # the KV calls only where a block fills or empties
            req = chunk.request
            computed = req.num_computed_tokens = chunk.start + n
            if computed // bs > len(req.block_hashes):
                kv.register_full_blocks(req, caching)
            if len(req.block_table) * bs >= computed + bs:
                chunk.rolled_back = tuple(kv.truncate(req))
        return ended

    def _count_accepted(self, verifies: list[VerifyChunk], tokens: list[int]
                        ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each chunk's accepted drafts (the longest prefix equal to the target's tokens:
        VerifyChunk.accepted), into the counters and the per-position counts; returns the
        step's per-position counts (step_positions). Plain Python: a list comparison
        settles a fully accepted draft, and at batch 1 numpy's per-call cost was 20x
        this loop's."""
        row = 0
        for c in verifies:
            draft = c.draft
            d = len(draft)
            if tokens[row:row + d] == draft:
                a = d
            else:                          # stops before d: some draft differs
                a = 0
                while tokens[row + a] == draft[a]:
                    a += 1
            c.accepted = a
            row += d + 1
        drafted, accepted = step_positions(verifies)
        c = self.counters
        c.spec_decode_num_drafts += len(verifies)
        c.spec_decode_num_draft_tokens += sum(drafted)
        c.spec_decode_num_accepted_tokens += sum(accepted)
        self.longest_draft = max(self.longest_draft, len(drafted))
        for j, n in enumerate(accepted):
            self.accepted_per_pos[j] += n
        return tuple(drafted), tuple(accepted)

    def per_position(self) -> tuple[int, ...]:
        """Accepted drafts by position, for every position some draft reached."""
        return tuple(self.accepted_per_pos[:self.longest_draft])

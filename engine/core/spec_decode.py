"""Speculative decoding on the core's side (docs/SPECULATIVE.md): drafts in, accepted
tokens out.

`SpecDecoder.schedule_drafts` is the scheduler's drafter: after the step's decodes got
their one token each, every eligible decode gets up to k drafts (vLLM's n-gram prompt
lookup, engine/core/ngram_proposer.py, a draft model, engine/core/draft_proposer.py, or
the benchmark-only oracle; one batched call for the step's eligible decodes) from what
is left of the token budget, and becomes a VerifyChunk: its last token and the drafts,
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

import json
from itertools import chain

import numpy as np

from engine.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from engine.core.ngram_proposer import TokenArrays, propose_ngram
from engine.core.scheduler import StepPlan, VerifyChunk
from engine.request import TRACE_TOKENS, RequestStatus, append_sampled


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


class OracleDrafts:
    """Benchmarks only (method "oracle"): the target's own greedy continuation, read from
    a first non-speculative run (`oracle_references`: JSON [[prompt ids, output ids], ...]),
    each draft kept with probability `oracle_acceptance`, else replaced by a wrong token:
    acceptance set by hand where dummy weights make real drafts meaningless."""

    def __init__(self, config: SpeculativeConfig, seed: int):
        self.p = config.oracle_acceptance
        self.rng = np.random.default_rng(seed)
        self.refs: dict[tuple, list[int]] = {}
        self._by_request: dict[str, list[int]] = {}   # a prompt is hashed once per request
        if config.oracle_references:
            with open(config.oracle_references) as f:
                self.set_references(json.load(f))

    def set_references(self, pairs) -> None:
        """(prompt ids, output ids) pairs: the target's outputs to propose from now on
        (a benchmark sets them after its own first run, in the same engine)."""
        self.refs = {tuple(prompt): list(output) for prompt, output in pairs}
        self._by_request = {}

    def release(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)

    def __call__(self, req, k: int) -> list[int]:
        return self.batch([req], [k])[0]

    def batch(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        """Each request's next reference tokens (up to its room), then one draw for all
        of them: a per-token draw in Python cost microseconds a token at batch 256."""
        outs, by_request = [], self._by_request
        for req, k in zip(reqs, rooms):
            ref = by_request.get(req.request_id)
            if ref is None:
                ref = by_request[req.request_id] = self.refs.get(tuple(req.prompt_token_ids), [])
            done = len(req.output_token_ids)
            outs.append(ref[done:done + k])
        if self.p >= 1.0:
            return outs
        flat = np.fromiter(chain.from_iterable(outs), np.int64)
        # a wrong token: a neighbour id (never the target's, always in the vocabulary)
        wrong = np.where(flat > 0, flat - 1, 1)
        if self.p > 0.0:
            wrong = np.where(self.rng.random(flat.shape[0]) < self.p, flat, wrong)
        flat, ends = wrong.tolist(), np.cumsum([len(o) for o in outs]).tolist()
        return [flat[e - len(o):e] for o, e in zip(outs, ends)]


# Async scheduling with speculation (docs/SPECULATIVE.md "Async scheduling"): steps that
# verify nothing may run ahead of their tokens, at most this many in a row; a request the
# proposer found no draft for is not waited for during as many steps.
SPEC_ASYNC_RUN = 4


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, scheduler, counters, seed: int = 0,
                 draft=None):
        self.config = config
        self.draft = draft          # DraftProposer (method draft_model), else None
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.counters = counters
        # accepted drafts by position (vLLM's spec_decode_num_accepted_tokens_per_pos)
        self.accepted_per_pos = [0] * MAX_SPECULATIVE_TOKENS
        self.longest_draft = 0        # positions reported (a position never drafted: none)
        self.oracle = OracleDrafts(config, seed) if config.method == "oracle" else None
        self.token_arrays = TokenArrays()     # the n-gram proposer's view of each request
        # structured outputs: (request, draft) -> the prefix its grammar accepts (the
        # engine's StructuredOutputManager.validate_drafts; the matcher does not advance)
        self.check_drafts = lambda req, draft: draft

    def propose_batch(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] drafts for each request: the draft model in one batched pass,
        the per-request proposers one by one."""
        if self.draft is not None:
            return self.draft.propose(reqs, rooms)
        if self.oracle is not None:
            return self.oracle.batch(reqs, rooms)
        return [self.propose(req, room) for req, room in zip(reqs, rooms)]

    def release(self, request_id: str) -> None:
        """The request ended: the draft model's blocks go back to its pool."""
        if self.draft is not None:
            self.draft.release(request_id)
        elif self.oracle is not None:
            self.oracle.release(request_id)

    def draft_used_blocks(self) -> int:
        return self.draft.num_used_blocks if self.draft is not None else 0

    def propose(self, req, k: int) -> list[int]:
        if self.oracle is not None:
            return self.oracle(req, k)
        c = self.config
        return propose_ngram(self.token_arrays.get(req), k, c.prompt_lookup_min,
                             c.prompt_lookup_max)

    def schedule_drafts(self, plan: StepPlan, budget: int) -> int:
        """Turn scheduled decodes into VerifyChunks, each draft costing one token of the
        budget; returns the budget left. The eligible decodes are proposed for in one
        batch (room: k, the budget, the length cap), then take their drafts in order,
        each cut to the budget left. Where the pool has no room for the drafts' slots
        the decode stays plain (speculation never preempts)."""
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
        for c, draft in zip(chunks, self.propose_batch([c.request for c in chunks], rooms)):
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

    def commit(self, verifies: list[VerifyChunk], tokens: list[int], now: float, itls,
               out, caching: bool) -> list:
        """The verify chunks' sampled tokens (1 + drafts each, in order) into their
        requests; returns the requests a token ends, with the reason. The accepted counts
        of all chunks come from one numpy comparison; then one append_sampled call takes
        every request's new tokens."""
        accepted = self._count_accepted(verifies, tokens)
        running = RequestStatus.RUNNING
        live, reqs, new_tokens, row = [], [], [], 0
        for chunk, a in zip(verifies, accepted):
            req = chunk.request
            chunk.accepted = a
            req.num_draft_tokens += chunk.num_tokens - 1
            req.num_accepted_tokens += a
            if req.status is running:
                new = tokens[row:row + a + 1]
                # the common case (no stop token, room for all) without a call
                if req.length_cap - len(req.prompt_token_ids) - len(req.output_token_ids) \
                        <= a or not req.stop_ids.isdisjoint(new):
                    new = _until_end(req, new)
                reqs += [req] * len(new)
                new_tokens.extend(new)
                live.append((chunk, len(new)))
                first = len(req.output_token_ids)      # the TUI's token trace (stats.py)
                if first < TRACE_TOKENS:
                    req.spec_trace.append((first, len(new), chunk.num_tokens - 1, a))
            row += chunk.num_tokens
        # only a request's last new token can end it (_until_end)
        ended = append_sampled(reqs, new_tokens, now, itls, out.request_ids, out.token_ids,
                               None if out.logprobs is None else [None] * len(new_tokens),
                               out.logprobs)
        kv, bs = self.kv, self.kv.block_size
        for chunk, n in live:      # the KV calls only where a block fills or empties
            req = chunk.request
            computed = req.num_computed_tokens = chunk.start + n
            if computed // bs > len(req.block_hashes):
                kv.register_full_blocks(req, caching)
            if len(req.block_table) * bs >= computed + bs:
                chunk.rolled_back = tuple(kv.truncate(req))
        return ended

    def _count_accepted(self, verifies: list[VerifyChunk], tokens: list[int]) -> list[int]:
        """Each chunk's accepted drafts (the longest prefix equal to the target's tokens),
        into the counters and the per-position counts."""
        counts = np.fromiter((c.num_tokens for c in verifies), np.int64, len(verifies))
        ends = np.cumsum(counts)
        starts = ends - counts
        drafts = np.full(int(ends[-1]), -1, np.int64)       # -1: the bonus row checks none
        drafts[np.delete(np.arange(drafts.shape[0]), ends - 1)] = np.fromiter(
            chain.from_iterable(c.draft for c in verifies), np.int64)
        # the first mismatch of each chunk (its bonus row at the latest) ends its accepted
        wrong = np.flatnonzero(np.asarray(tokens, np.int64) != drafts)
        accepted = wrong[np.searchsorted(wrong, starts)] - starts
        c = self.counters
        c.spec_decode_num_drafts += len(verifies)
        c.spec_decode_num_draft_tokens += int(ends[-1]) - len(verifies)
        c.spec_decode_num_accepted_tokens += int(accepted.sum())
        longest = int(counts.max()) - 1
        self.longest_draft = max(self.longest_draft, longest)
        # position j is accepted by every chunk that accepted more than j drafts
        reached = np.bincount(accepted, minlength=longest + 1)[::-1].cumsum()[::-1]
        for j, n in enumerate(reached[1:].tolist()):
            self.accepted_per_pos[j] += n
        return accepted.tolist()

    def per_position(self) -> tuple[int, ...]:
        """Accepted drafts by position, for every position some draft reached."""
        return tuple(self.accepted_per_pos[:self.longest_draft])

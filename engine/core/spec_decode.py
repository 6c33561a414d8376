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
still pending on the device. Seeded random requests are: their rows draw from their own
generator (engine/worker/rejection.py).
"""
from __future__ import annotations

import json
import random
import weakref

from engine.config import MAX_SPECULATIVE_TOKENS, EngineConfig, SpeculativeConfig
from engine.core.ngram_proposer import TokenArrays, propose_ngram
from engine.core.scheduler import StepPlan, VerifyChunk
from engine.request import RequestStatus, append_sampled


def verify_rows(config: EngineConfig) -> int:
    """Decode rows of the widest verify step of the k the engine starts with (every
    running request with k drafts, the drafts within the token budget): the CUDA graphs
    capture verify steps up to that many rows (capped by the largest decode bucket); 0
    when it starts without speculation (a k or budget set larger live runs the mixed
    graphs or eagerly)."""
    sched = config.scheduler
    if not sched.num_speculative_tokens:
        return 0
    return min(sched.max_num_seqs * (1 + sched.num_speculative_tokens),
               max(sched.max_num_seqs, sched.max_num_batched_tokens))


def _until_end(req, tokens: list[int]) -> list[int]:
    """The tokens up to the first that ends the request (a stop token, its length cap)."""
    room = req.length_cap - req.num_tokens
    if room < len(tokens):
        tokens = tokens[:max(room, 1)]
    stops = req.stop_ids
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
        self.rng = random.Random(seed)
        self.refs: dict[tuple, list[int]] = {}
        self._by_request = weakref.WeakKeyDictionary()   # a prompt is hashed once per request
        if config.oracle_references:
            with open(config.oracle_references) as f:
                self.set_references(json.load(f))

    def set_references(self, pairs) -> None:
        """(prompt ids, output ids) pairs: the target's outputs to propose from now on
        (a benchmark sets them after its own first run, in the same engine)."""
        self.refs = {tuple(prompt): list(output) for prompt, output in pairs}
        self._by_request = weakref.WeakKeyDictionary()

    def __call__(self, req, k: int) -> list[int]:
        ref = self._by_request.get(req)
        if ref is None:
            ref = self._by_request[req] = self.refs.get(tuple(req.prompt_token_ids), [])
        if not ref:
            return []
        done = len(req.output_token_ids)
        out = ref[done:done + k]
        # a wrong token: a neighbour id (never the target's, always in the vocabulary)
        return [t if self.rng.random() < self.p else (t - 1 if t > 0 else 1) for t in out]


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

    def propose_batch(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] drafts for each request: the draft model in one batched pass,
        the per-request proposers one by one."""
        if self.draft is not None:
            return self.draft.propose(reqs, rooms)
        return [self.propose(req, room) for req, room in zip(reqs, rooms)]

    def release(self, request_id: str) -> None:
        """The request ended: the draft model's blocks go back to its pool."""
        if self.draft is not None:
            self.draft.release(request_id)

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
        chunks, rooms = [], []
        for c in plan.decodes:
            req = c.request
            room = min(k, budget, req.length_cap - req.num_tokens - 1)
            if room <= 0 or req.processed or req.status is not RequestStatus.RUNNING:
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
        for c, draft in zip(chunks, self.propose_batch([c.request for c in chunks], rooms)):
            draft = draft[:budget]
            if not draft:
                c.request.spec_quiet = SPEC_ASYNC_RUN
            elif self.kv.reserve(c.request, 1 + len(draft), plan.copies):
                plan.verifies.append(VerifyChunk(c.request, c.start, draft))
                budget -= len(draft)
                verified.add(id(c))
        plan.decodes = [c for c in plan.decodes if id(c) not in verified]
        return budget

    def commit(self, verifies: list[VerifyChunk], tokens: list[int], now: float, itls,
               out, caching: bool) -> list:
        """The verify chunks' sampled tokens (1 + drafts each, in order) into their
        requests; returns the requests a token ends, with the reason."""
        ended, i = [], 0
        c = self.counters
        for chunk in verifies:
            req, draft = chunk.request, chunk.draft
            row = tokens[i:i + chunk.num_tokens]
            i += chunk.num_tokens
            accepted = 0
            while accepted < len(draft) and row[accepted] == draft[accepted]:
                self.accepted_per_pos[accepted] += 1
                accepted += 1
            c.spec_decode_num_drafts += 1
            c.spec_decode_num_draft_tokens += len(draft)
            self.longest_draft = max(self.longest_draft, len(draft))
            c.spec_decode_num_accepted_tokens += accepted
            chunk.accepted = accepted
            req.num_draft_tokens += len(draft)
            req.num_accepted_tokens += accepted
            if req.status is not RequestStatus.RUNNING:
                continue
            new = _until_end(req, row[:accepted + 1])
            done = append_sampled([req] * len(new), new, now, itls, out.request_ids,
                                  out.token_ids,
                                  None if out.logprobs is None else [None] * len(new),
                                  out.logprobs)
            ended.extend(done)          # (only the last token can end it)
            req.num_computed_tokens = chunk.start + len(new)
            self.kv.register_full_blocks(req, caching)
            chunk.rolled_back = tuple(self.kv.truncate(req))
        return ended

    def per_position(self) -> tuple[int, ...]:
        """Accepted drafts by position, for every position some draft reached."""
        return tuple(self.accepted_per_pos[:self.longest_draft])

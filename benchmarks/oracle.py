"""The oracle drafter (docs/SPECULATIVE.md "Measuring on the GPU: the oracle drafter"):
a speculative-decoding Proposer for benchmarks and tests, handed to the engine as
`LLM(..., proposer=OracleProposer(...))` or `LLMEngine(config, proposer=...)`.

It proposes the target's own greedy continuation, read from a first non-speculative run
(`set_references`: [(prompt ids, output ids), ...]), each draft kept with probability
`p`, else replaced by a wrong token: acceptance set by hand where dummy weights make real
drafts meaningless. Not for serving: no flag or JSON field selects it.
"""
from __future__ import annotations

import numpy as np


class OracleProposer:
    method = "oracle"             # what snapshots show as the speculative method

    def __init__(self, references=(), p: float = 1.0, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"the oracle's acceptance p must be in [0, 1], got {p!r}")
        self.p = p
        self.rng = np.random.default_rng(seed)
        self.refs: dict[tuple, list[int]] = {}
        self._by_request: dict[str, list[int]] = {}   # a prompt is hashed once per request
        self.set_references(references)

    def set_references(self, pairs) -> None:
        """(prompt ids, output ids) pairs: the target's outputs to propose from now on
        (a benchmark sets them after its own first run, in the same engine)."""
        self.refs = {tuple(prompt): list(output) for prompt, output in pairs}
        self._by_request = {}

    def release(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)

    def propose(self, reqs: list, rooms: list[int]) -> list[list[int]]:
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
        # one draw for every draft token; each kept or made wrong: a neighbour id (never
        # the target's, always in the vocabulary). Lists, not arrays: at batch 1 the
        # numpy selection cost 4x this (the draws are the same)
        n = sum(map(len, outs))
        keep = iter((self.rng.random(n) < self.p).tolist() if self.p > 0.0 else [False] * n)
        return [[t if next(keep) else (t - 1 if t > 0 else 1) for t in out] for out in outs]

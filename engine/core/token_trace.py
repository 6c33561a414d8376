"""A finished request's token trace (engine/outputs.py TokenTrace): its output tokens
with their emission times, speculative origin and logprobs, packed once when it ends.

Only requests that asked for logprobs (their TokenLogprobs are kept as they are
emitted: Request.last_logprobs), were verified with drafts (Request.spec_trace, one
entry per verify: engine/core/spec_decode.py) or asked for it (SamplingParams.token_trace)
have one; the stats recorder keeps the latest few (TRACE_KEEP of each kind), so memory
stays bounded whatever the workload, and a request that asked gets its own in its final
output (FinishedRequest.trace), however many others ended beside it.
"""
from __future__ import annotations

import numpy as np

from engine.request import TRACE_TOKENS, Request
from engine.outputs import TOKEN_BONUS, TOKEN_CORRECTION, TOKEN_DRAFT, TokenTrace


def build_trace(req: Request) -> TokenTrace | None:
    """The trace of an ended request (no pending token left), or None when it has no
    tokens or nothing to trace (no logprobs, no drafts, and it did not ask for one)."""
    out, lps, verifies = req.output_token_ids, req.logprobs_trace, req.spec_trace
    if not out or (lps is None and not verifies and not req.params.token_trace):
        return None
    n = min(len(out), len(req.token_times), TRACE_TOKENS)
    top, packed, raw = 0, b"", b""
    if lps is not None and len(lps) == n:     # one entry per token (else none is shown)
        top = max(len(lp.token_ids) for lp in lps)
        packed = pack_logprobs(lps, top)
        if any(lp.raw is not None for lp in lps):
            raw = pack_logprobs([lp.raw for lp in lps], top)
    return TokenTrace(req.request_id, len(out), np.asarray(out[:n], "<i4").tobytes(),
                      np.asarray(req.token_times[:n], "<f8").tobytes(),
                      bytes(spec_origins(verifies, n)), top, packed, raw)


def spec_origins(verifies, n: int) -> bytearray:
    """One byte per token: TOKEN_* in the low 2 bits, the drafts its verify checked
    above. `verifies`: (first output index, tokens emitted, drafted, accepted) each."""
    origin = bytearray(n)
    for first, emitted, drafted, accepted in verifies:
        target = TOKEN_BONUS if accepted == drafted else TOKEN_CORRECTION
        for j in range(min(emitted, n - first)):
            origin[first + j] = (TOKEN_DRAFT if j < accepted else target) | drafted << 2
    return origin


def pack_logprobs(entries: list, top: int) -> bytes:
    """int32 ids [n, top] (-1 pads a shorter entry), float64 values [n, top], int32
    ranks [n] (-1: the token has no entry)."""
    n = len(entries)
    ids = np.full((n, top), -1, "<i4")
    values = np.zeros((n, top), "<f8")
    ranks = np.full(n, -1, "<i4")
    for i, lp in enumerate(entries):
        if lp is not None:
            k = len(lp.token_ids)
            ids[i, :k], values[i, :k], ranks[i] = lp.token_ids, lp.logprobs, lp.rank
    return ids.tobytes() + values.tobytes() + ranks.tobytes()

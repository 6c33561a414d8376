"""The scheduler's one pass over the running requests (engine/core/scheduler.py).

Every step looks at every running request: is it still prefilling, does it decode
next, and does its next slot lie in a block it owns alone (then the decode needs no KV
work). `classify` answers all three in one list comprehension, and `fast_chunks` makes
the ScheduledChunks of a run of such decodes in one more (a ScheduledChunk is built in
C); the reservation's Python runs only for the requests that need KV work (a block
boundary every block_size tokens, a shared block to copy, a preemption).
"""
from __future__ import annotations

from itertools import compress, repeat
from operator import eq

from engine.core.step_plan import ScheduledChunk
from engine.request import Request

SKIP, FAST, SLOW, PREFILL = 0, 1, 2, 3   # classify's codes


def classify(order: list[Request], page: int, refs, followers: bool) -> list[int]:
    """Each request's code: PREFILL (more than one token to compute), FAST (decodes
    next, its slot in a block it owns alone), SLOW (decodes next, needs a block or a
    copy), SKIP (a dedup follower, or a request whose pending token ends it by length:
    its token count reaches Request.length_cap). A prompt's last token is a PREFILL chunk
    of a request that asks prompt logprobs: that chunk delivers them
    (engine/core/prompt_logprobs.py). `refs`: the pool's refcounts."""
    codes = [PREFILL if (n := len(r.prompt_token_ids) + len(r.output_token_ids)
                         - (c := r.num_computed_tokens)) > 1
             else SKIP if n != 1 or (r.pending_row >= 0 and n + c >= r.length_cap)
             else PREFILL if r.prompt_logprobs is not None and c < len(r.prompt_token_ids)
             else FAST if (i := c // page) < len(t := r.block_table) and refs[t[i]] == 1
             else SLOW
             for r in order]
    if followers:
        codes = [SKIP if r.dedup_leader is not None else k for r, k in zip(order, codes)]
    return codes


def split(order: list[Request], codes: list[int]
          ) -> tuple[list[Request], list[bool] | None, list[Request]]:
    """(the decodes, whether each is FAST (None: all are), the prefilling requests),
    each in `order`."""
    if codes.count(FAST) == len(order):
        return list(order), None, []
    prefilling = list(compress(order, map(eq, codes, repeat(PREFILL))))
    decoding = [k == FAST or k == SLOW for k in codes]
    decodes = list(compress(order, decoding))
    return decodes, [k == FAST for k in compress(codes, decoding)], prefilling


def fast_chunks(reqs: list[Request]) -> list[ScheduledChunk]:
    """One token each, from its computed tokens on (decodes that need no KV work)."""
    return [ScheduledChunk(r, r.num_computed_tokens, 1, True) for r in reqs]

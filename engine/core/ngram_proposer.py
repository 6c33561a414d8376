"""N-gram drafts (prompt lookup decoding, vLLM's method "ngram"): host numpy, per request.

The request's own tokens (prompt + output) are the draft model: the longest suffix n-gram
(n from prompt_lookup_max down to prompt_lookup_min) that occurred earlier proposes the
k tokens that followed its most recent earlier occurrence (vLLM takes the first; the
most recent one follows the text being written more closely). No match: no drafts, the
request decodes one token as usual.
"""
from __future__ import annotations

import weakref

import numpy as np

# tokens searched, counted back from the end: bounds the host cost per request per step
# (vLLM searches the whole context; a repetition further back is rarely the one that helps)
SEARCH_WINDOW = 2048


def propose_ngram(tokens, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k draft tokens that continue `tokens` (a list or an int array), or [] when no
    suffix n-gram recurs. One comparison over the window finds where the last token
    occurred before; each longer n-gram only re-checks the matches still alive, one
    token further back (not a window scan per n)."""
    if k <= 0 or len(tokens) < n_min + 1:
        return []
    t = np.asarray(tokens[-SEARCH_WINDOW:], dtype=np.int64)
    last = t.shape[0] - 1
    ends = np.flatnonzero(t[:last] == t[last])     # where a match of length 1 ends
    n = 1
    while n < n_max and ends.shape[0]:
        longer = ends[ends >= n]
        longer = longer[t[longer - n] == t[last - n]]
        if not longer.shape[0]:
            break
        ends, n = longer, n + 1
    if not ends.shape[0] or n < n_min:
        return []
    start = int(ends[-1]) + 1                      # the most recent longest match
    return t[start:start + k].tolist()


class TokenArrays:
    """Each request's prompt + output as one growing int array, appended to as tokens
    come (the proposer reads the array each step instead of converting the whole token
    list). Read only while the request has no token pending on the device, so every
    token in it is final. Weakly keyed: an entry goes with its request."""

    def __init__(self):
        self._arrays = weakref.WeakKeyDictionary()     # request -> (array, length)

    def get(self, req) -> np.ndarray:
        prompt, out = req.prompt_token_ids, req.output_token_ids
        total = len(prompt) + len(out)
        arr, n = self._arrays.get(req, (None, 0))
        if arr is None or n > total:
            arr, n = np.empty(max(64, 2 * total), dtype=np.int64), len(prompt)
            arr[:n] = prompt
        if n < total:
            if arr.shape[0] < total:
                arr = np.concatenate((arr[:n], np.empty(total, dtype=np.int64)))
            arr[n:total] = out[n - len(prompt):]
        self._arrays[req] = (arr, total)
        return arr[:total]


class NgramProposer:
    """The Proposer of method ngram (engine/core/spec_decode.py): each request's drafts
    from its own tokens, one request at a time."""
    method = "ngram"

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.token_arrays = TokenArrays()     # each request's tokens as one array

    def propose(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        arrays, lo, hi = self.token_arrays, self.n_min, self.n_max
        return [propose_ngram(arrays.get(req), k, lo, hi) for req, k in zip(reqs, rooms)]

    def release(self, request_id: str) -> None:
        """Nothing to drop: a request's array goes with the request (weakly keyed)."""

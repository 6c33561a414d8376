"""N-gram drafts (prompt lookup decoding, vLLM's method "ngram"): host numpy, per request.

The request's own tokens (prompt + output) are the draft model: the longest suffix n-gram
(n from prompt_lookup_max down to prompt_lookup_min) that occurred earlier proposes the
k tokens that followed its most recent earlier occurrence (vLLM takes the first; the
most recent one follows the text being written more closely). No match: no drafts, the
request decodes one token as usual.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# tokens searched, counted back from the end: bounds the host cost per request per step
# (vLLM searches the whole context; a repetition further back is rarely the one that helps)
SEARCH_WINDOW = 2048


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k draft tokens that continue `tokens`, or [] when no suffix n-gram recurs."""
    if k <= 0 or len(tokens) < n_min + 1:
        return []
    t = np.asarray(tokens[-SEARCH_WINDOW:], dtype=np.int64)
    size = t.shape[0]
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = t[size - n:]
        # windows that start before the suffix itself and are followed by a token
        windows = sliding_window_view(t[:size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.shape[0]:
            start = int(hits[-1]) + n
            return t[start:start + k].tolist()
    return []

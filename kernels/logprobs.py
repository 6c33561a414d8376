"""top_logprobs: the logprobs of a few rows of a step's logits, in one launch.

torch's way (index_select, float, log_softmax, gather, a compare-and-sum for the rank,
topk, two cats) is ~38 launches and copies for 32 rows of a 151,936-token vocabulary,
torch.topk alone ~18 (its multi-block radix select): 0.44-0.74 ms of host time a step
on the H200's hosts (docs/KERNELS.md "Small kernels"). Here one program per row walks
the row once in BLOCK-wide tiles (the next one loaded before the current one is read),
keeping per lane the online log-sum-exp and the count of entries strictly above the
row's token (its rank - 1), reduced across lanes once at the end, and the top n in a
list of slots in registers: a tile's entries above the list's smallest replace it one
at a time, largest first, so most tiles cost one comparison. Entries of -inf (a
processed row's top-k / min_p cuts, a grammar mask) never enter the list on the way;
if fewer than n finite entries exist, a second walk fills the rest with the first -inf
entries, as distinct ids. The result is packed per row into int32 (LAYOUT below) for
one copy to the host. The order among equal values may differ from torch.topk's, which
does not define it either. kernels/reference.py top_logprobs is the torch twin.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import next_pow2

BLOCK = 4096        # logits per tile (8 per thread at 16 warps: 103 registers, no spills)
# LAYOUT of a packed row (int32, width 2n + 3): [0] the token, [1, n] the top n ids by
# value; [n + 1] the token's value, [n + 2, 2n + 1] the top n values (float32 bits);
# [2n + 2] the token's rank (1 + entries strictly above it).
NEG = tl.constexpr(-3.0e38)      # the selection key of a -inf entry: above TAKEN
TAKEN = tl.constexpr(-3.4e38)


@triton.jit(do_not_specialize=["V"])
def _top_logprobs_kernel(src_ptr, rows_ptr, tok_ptr, out_ptr, V, stride_s, stride_o,
                         N: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                         NORMALIZE: tl.constexpr, HAS_ROWS: tl.constexpr):
    j = tl.program_id(0)
    row = tl.load(rows_ptr + j).to(tl.int64) if HAS_ROWS else j.to(tl.int64)
    tok = tl.load(tok_ptr + j).to(tl.int64)
    base = src_ptr + row * stride_s
    picked = tl.load(base + tok).to(tl.float32)
    offs = tl.arange(0, BLOCK)
    slot = tl.arange(0, K)
    # active slots start at -inf (the first finite entries fill them); padding slots
    # (>= N) hold +inf, so they are never the list's smallest
    top_v = tl.where(slot < N, float("-inf"), float("inf"))
    top_i = tl.full([K], -1, tl.int32)
    kth = tl.min(top_v, 0)
    # per lane: the running max and sum of exp (one cross-lane reduction at the end),
    # and the count above the token; the next tile is loaded before this one is read
    m_l = tl.full([BLOCK], float("-inf"), tl.float32)
    s_l = tl.zeros([BLOCK], tl.float32)
    above_l = tl.zeros([BLOCK], tl.int32)
    x_next = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    for c in range(0, V, BLOCK):
        x = x_next
        nxt = c + BLOCK + offs
        x_next = tl.load(base + nxt, mask=nxt < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_l, x)
        m_ok = tl.where(m_new == float("-inf"), 0.0, m_new)   # (no -inf - -inf)
        s_l = s_l * tl.exp(m_l - m_ok) + tl.exp(x - m_ok)
        m_l = m_new
        above_l += (x > picked).to(tl.int32)
        if N > 0:
            cand = tl.where(x > kth, x, float("-inf"))
            best = tl.max(cand, 0)
            while best > kth:
                at = tl.argmax(cand, 0)
                lo = tl.argmin(top_v, 0)
                top_v = tl.where(slot == lo, best, top_v)
                top_i = tl.where(slot == lo, c + at, top_i)
                kth = tl.min(top_v, 0)
                cand = tl.where((offs == at) | (cand <= kth), float("-inf"), cand)
                best = tl.max(cand, 0)
    m = tl.max(m_l, 0)
    m = tl.where(m == float("-inf"), 0.0, m)      # a row of -inf only: lse -inf
    s = tl.sum(s_l * tl.exp(m_l - m), 0)
    above = tl.sum(above_l, 0)
    if N > 0:   # fewer than N finite entries: the first -inf ones fill the empty slots
        empty = tl.sum(((slot < N) & (top_i < 0)).to(tl.int32), 0)
        c = 0
        while (empty > 0) & (c < V):
            idx = c + offs
            x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
            neg = (x == float("-inf")) & (idx < V)
            while (empty > 0) & (tl.max(neg.to(tl.int32), 0) > 0):
                at = tl.argmax(neg.to(tl.int32), 0)
                free = tl.argmax(((slot < N) & (top_i < 0)).to(tl.int32), 0)
                top_i = tl.where(slot == free, c + at, top_i)
                neg = neg & (offs != at)
                empty -= 1
            c += BLOCK
    lse = m + tl.log(s)
    out = out_ptr + j.to(tl.int64) * stride_o
    shift = lse if NORMALIZE else 0.0
    tl.store(out, tok.to(tl.int32))
    tl.store(out + N + 1, (picked - shift).to(tl.int32, bitcast=True))
    tl.store(out + 2 * N + 2, above + 1)
    # the list in descending order: N selections of the largest not yet taken
    key = tl.where(slot < N, tl.maximum(top_v, NEG), TAKEN)
    for r in tl.static_range(N):
        at = tl.argmax(key, 0)
        v = tl.sum(tl.where(slot == at, top_v, 0.0), 0)      # (-inf stays -inf)
        i = tl.sum(tl.where(slot == at, top_i, 0), 0)
        tl.store(out + 1 + r, i)
        tl.store(out + N + 2 + r, (v - shift).to(tl.int32, bitcast=True))
        key = tl.where(slot == at, TAKEN, key)


def top_logprobs(src: torch.Tensor, tokens: torch.Tensor, n: int, normalize: bool,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Row rows[j] of src [R, V] (row j without rows), with its token tokens[j]: int32
    [L, 2n + 3] packed (LAYOUT): the token and the top n ids, their values (the row's
    log-softmax if normalize, else the row as float32) and the token's rank."""
    assert src.dim() == 2 and src.stride(-1) == 1
    L = tokens.shape[0]
    out = torch.empty((L, 2 * n + 3), dtype=torch.int32, device=src.device)
    if L == 0:
        return out
    _top_logprobs_kernel[(L,)](
        src, rows if rows is not None else tokens, tokens, out, src.shape[1], src.stride(0),
        out.stride(0), N=n, K=max(2, next_pow2(n)), BLOCK=BLOCK, NORMALIZE=normalize,
        HAS_ROWS=rows is not None, num_warps=16)
    return out

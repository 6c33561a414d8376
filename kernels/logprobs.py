"""top_logprobs: the logprobs of a few rows of a step's logits, in one launch.

torch's way (index_select, float, log_softmax, gather, a compare-and-sum for the rank,
topk, two cats) is ~38 launches and copies for 32 rows of a 151,936-token vocabulary,
torch.topk alone ~18 (its multi-block radix select): 0.44-0.74 ms of host time a step
on the H200's hosts (docs/KERNELS.md "Small kernels"). Here grid (rows, splits): each
row is cut into `splits` ranges of whole tiles (one wave of programs in all), and a
program walks its range in BLOCK-wide tiles (the next one loaded before the current
one is read), keeping per lane the online log-sum-exp and the count of entries
strictly above the row's token (its rank - 1), reduced across lanes once at the end,
and the top n in a list of slots in registers: a tile's entries above the list's
smallest replace it one at a time, largest first, so most tiles cost one comparison.
The last program of a row to finish (an acq_rel counter it resets, as kernels/argmax.py's
splits) merges the partial sums and counts and takes the top n of all the lists.
Entries of -inf (a processed row's top-k / min_p cuts, a grammar mask) never enter a
list; if fewer than n finite entries exist, a last walk fills the rest with the first
-inf entries, as distinct ids. The result is packed per row into int32 (LAYOUT below)
for one copy to the host. The order among equal values may differ from torch.topk's,
which does not define it either. kernels/reference.py top_logprobs is the torch twin.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import num_sms, zeroed_scratch

BLOCK = 4096        # logits per tile (8 per thread at 16 warps: 103 registers, no spills)
MAX_SPLITS = 64     # programs a row at most (the merge reads their lists as one tile)
LIST_SLOTS = 32     # the top list's slots: n <= 32 (MAX_LOGPROBS is 20); n itself is not
#                     a constexpr, so no request's n compiles a variant mid-serving
# LAYOUT of a packed row (int32, width 2n + 3): [0] the token, [1, n] the top n ids by
# value; [n + 1] the token's value, [n + 2, 2n + 1] the top n values (float32 bits);
# [2n + 2] the token's rank (1 + entries strictly above it).
NEG = tl.constexpr(-3.0e38)      # the selection key of a -inf entry: above TAKEN
TAKEN = tl.constexpr(-3.4e38)


@triton.jit
def _walk(base, lo, hi, picked, N, K: tl.constexpr, BLOCK: tl.constexpr):
    """Entries [lo, hi) of a row: their max m and sum of exp(x - m) (m 0 where all are
    -inf), the count strictly above picked, and their top N (values and ids, unordered;
    slots past N hold +inf, empty ones -inf and id -1)."""
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
    x_next = tl.load(base + lo + offs, mask=lo + offs < hi, other=float("-inf")).to(tl.float32)
    for c in range(lo, hi, BLOCK):
        x = x_next
        nxt = c + BLOCK + offs
        x_next = tl.load(base + nxt, mask=nxt < hi, other=float("-inf")).to(tl.float32)
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
                low = tl.argmin(top_v, 0)
                top_v = tl.where(slot == low, best, top_v)
                top_i = tl.where(slot == low, c + at, top_i)
                kth = tl.min(top_v, 0)
                cand = tl.where((offs == at) | (cand <= kth), float("-inf"), cand)
                best = tl.max(cand, 0)
    m = tl.max(m_l, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(s_l * tl.exp(m_l - m), 0), tl.sum(above_l, 0), top_v, top_i


@triton.jit
def _finish(base, out, tok, picked, lse, above, cand_v, cand_i, V, N,
            K: tl.constexpr, BLOCK: tl.constexpr, NORMALIZE: tl.constexpr):
    """Write a row's packed result from its candidates (cand_v / cand_i, any shape, -inf
    and id -1 where empty): the top N in descending order, the empty ones then filled
    with the row's first -inf entries (a row with fewer than N finite entries)."""
    slot = tl.arange(0, K)
    shift = lse if NORMALIZE else 0.0
    tl.store(out, tok.to(tl.int32))
    tl.store(out + N + 1, (picked - shift).to(tl.int32, bitcast=True))
    tl.store(out + 2 * N + 2, above + 1)
    if N > 0:
        sel_v = tl.full([K], float("-inf"), tl.float32)
        sel_i = tl.full([K], -1, tl.int32)
        key = tl.maximum(cand_v, NEG)
        for r in range(N):                # N selections of the largest not yet taken
            at = tl.argmax(key, 0)
            hit = tl.arange(0, key.shape[0]) == at
            sel_v = tl.where(slot == r, tl.sum(tl.where(hit, cand_v, 0.0), 0), sel_v)
            sel_i = tl.where(slot == r, tl.sum(tl.where(hit, cand_i, 0), 0), sel_i)
            key = tl.where(hit, TAKEN, key)
        offs = tl.arange(0, BLOCK)
        empty = tl.sum(((slot < N) & (sel_i < 0)).to(tl.int32), 0)
        c = 0
        while (empty > 0) & (c < V):
            idx = c + offs
            x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
            neg = (x == float("-inf")) & (idx < V)
            while (empty > 0) & (tl.max(neg.to(tl.int32), 0) > 0):
                at = tl.argmax(neg.to(tl.int32), 0)
                free = tl.argmax(((slot < N) & (sel_i < 0)).to(tl.int32), 0)
                sel_i = tl.where(slot == free, c + at, sel_i)
                neg = neg & (offs != at)
                empty -= 1
            c += BLOCK
        tl.store(out + 1 + slot, sel_i, mask=slot < N)
        tl.store(out + N + 2 + slot, (sel_v - shift).to(tl.int32, bitcast=True), mask=slot < N)


@triton.jit(do_not_specialize=["V", "chunk", "splits", "N", "stride_s", "stride_o"])
def _top_logprobs_kernel(src_ptr, rows_ptr, tok_ptr, out_ptr, ws_ptr, cnt_ptr, V, chunk,
                         splits, stride_s, stride_o, N,
                         K: tl.constexpr, BLOCK: tl.constexpr, NORMALIZE: tl.constexpr,
                         HAS_ROWS: tl.constexpr, SPLITS_P2: tl.constexpr):
    j = tl.program_id(0)
    sp = tl.program_id(1)
    row = tl.load(rows_ptr + j).to(tl.int64) if HAS_ROWS else j.to(tl.int64)
    tok = tl.load(tok_ptr + j).to(tl.int64)
    base = src_ptr + row * stride_s
    picked = tl.load(base + tok).to(tl.float32)
    lo = sp * chunk
    m, s, above, top_v, top_i = _walk(base, lo, tl.minimum(lo + chunk, V), picked, N, K, BLOCK)
    out = out_ptr + j.to(tl.int64) * stride_o
    slot = tl.arange(0, K)
    if splits == 1:
        _finish(base, out, tok, picked, m + tl.log(s), above,
                tl.where(slot < N, top_v, float("-inf")), top_i, V, N, K, BLOCK, NORMALIZE)
    else:
        # this split's partial: m, s, the count, then its list (values, and ids + 1 as
        # float bits: an empty slot's -1 is stored as 0)
        W = 3 + 2 * K
        part = ws_ptr + (j * splits + sp).to(tl.int64) * W
        tl.store(part, m)
        tl.store(part + 1, s)
        tl.store(part + 2, above.to(tl.float32, bitcast=True))
        tl.store(part + 3 + slot, tl.where(slot < N, top_v, float("-inf")))
        tl.store(part + 3 + K + slot, (top_i + 1).to(tl.float32, bitcast=True))
        # the last split of the row to finish merges (as kernels/argmax.py's splits)
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + j, 1, sem="acq_rel", scope="gpu")
        if done == splits - 1:
            tl.store(cnt_ptr + j, 0)
            sps = tl.arange(0, SPLITS_P2)
            ok = sps < splits
            parts = ws_ptr + (j * splits + sps).to(tl.int64) * W
            pm = tl.load(parts, mask=ok, other=0.0, cache_modifier=".cg")
            ps = tl.load(parts + 1, mask=ok, other=0.0, cache_modifier=".cg")
            pa = tl.load(parts + 2, mask=ok, other=0.0, cache_modifier=".cg")
            pm = tl.where(ps > 0.0, pm, float("-inf"))      # splits of -inf only
            mx = tl.max(pm, 0)
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            total = tl.sum(tl.where(ps > 0.0, ps * tl.exp(pm - mx), 0.0), 0)
            count = tl.sum(pa.to(tl.int32, bitcast=True), 0)
            cm = ok[:, None] & (slot < N)[None, :]
            cv = tl.load(parts[:, None] + 3 + slot[None, :], mask=cm, other=float("-inf"),
                         cache_modifier=".cg")
            ci = tl.load(parts[:, None] + 3 + K + slot[None, :], mask=cm, other=0.0,
                         cache_modifier=".cg").to(tl.int32, bitcast=True) - 1
            _finish(base, out, tok, picked, mx + tl.log(total), count,
                    tl.reshape(cv, [SPLITS_P2 * K]), tl.reshape(ci, [SPLITS_P2 * K]), V,
                    N, K, BLOCK, NORMALIZE)


def plan_splits(rows: int, vocab: int, sms: int) -> tuple[int, int]:
    """(splits a row, tokens a split): one wave of programs (a program of 16 warps takes
    an SM), whole tiles, at most MAX_SPLITS."""
    tiles = triton.cdiv(vocab, BLOCK)
    splits = max(1, min(tiles, MAX_SPLITS, sms // max(rows, 1)))
    chunk = triton.cdiv(tiles, splits) * BLOCK
    return triton.cdiv(vocab, chunk), chunk


def top_logprobs(src: torch.Tensor, tokens: torch.Tensor, n: int, normalize: bool,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Row rows[j] of src [R, V] (row j without rows), with its token tokens[j]: int32
    [L, 2n + 3] packed (LAYOUT): the token and the top n ids, their values (the row's
    log-softmax if normalize, else the row as float32) and the token's rank."""
    assert src.dim() == 2 and src.stride(-1) == 1
    L, V = tokens.shape[0], src.shape[1]
    out = torch.empty((L, 2 * n + 3), dtype=torch.int32, device=src.device)
    if L == 0:
        return out
    assert n <= LIST_SLOTS, n
    splits, chunk = plan_splits(L, V, num_sms(src.device))
    ws = cnt = out
    if splits > 1:
        ws = torch.empty((L, splits, 3 + 2 * LIST_SLOTS), dtype=torch.float32,
                         device=src.device)
        cnt = zeroed_scratch(src.device, "top_logprobs_counters", L, torch.int32)
    _top_logprobs_kernel[(L, splits)](
        src, rows if rows is not None else tokens, tokens, out, ws, cnt, V, chunk, splits,
        src.stride(0), out.stride(0), n, K=LIST_SLOTS, BLOCK=BLOCK, NORMALIZE=normalize,
        HAS_ROWS=rows is not None, SPLITS_P2=MAX_SPLITS, num_warps=16)
    return out

"""argmax: the greedy token of each logits row, in one launch.

torch's argmax of a [1, 151936] bf16 row takes ~9 us on an H100 plus a memset and the
gaps around them (scripts/step_timeline.py), a tenth of what a batch-1 decode step
spends outside its GEMVs. Here, grid (M, splits): program (m, s) scans BLOCK-wide tiles
of its chunk of row m, each lane keeping its largest value and that value's first index
(a later tile wins only where strictly larger; one reduction across lanes at the end,
the next tile requested before the current one is compared), and writes the chunk's
maximum with its smallest index; the last program of a row to finish (a
per-row counter bumped with an acq_rel atomic after a barrier, reset by that program, as
in kernels/linear.py's split-K) picks the largest partial, the smallest split on ties.
So the result is torch.argmax's: the first index of the maximum. (NaN is ignored here;
torch returns the first NaN's index.) Grid and constexprs depend on shapes only: CUDA
graph safe (the decode graphs capture it, engine/worker/cuda_graphs.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._common import num_sms, zeroed_scratch
from kernels.pdl import pdl_enter

BLOCK = 2048            # logits per tile (16 per thread at 4 warps)
PROGRAMS_PER_SM = 4     # splits per row: about this many programs per SM in all


@triton.jit(do_not_specialize=["splits"])
def _argmax_kernel(x_ptr, out_ptr, pv_ptr, pi_ptr, cnt_ptr, V, chunk, splits, stride_xm,
                   MERGE_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    m = tl.program_id(0)
    s = tl.program_id(1)
    pdl_enter(PDL)      # the logits come from the previous kernel
    lo = s * chunk
    hi = tl.minimum(lo + chunk, V)
    row = x_ptr + m.to(tl.int64) * stride_xm
    # per lane, the largest value and its first index (a later tile wins only where
    # strictly larger); reduced across lanes once at the end, and the next tile loaded
    # before this one is compared (two tiles in flight: Triton pipelines no plain loads)
    offs = lo + tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = offs
    x = tl.load(row + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
    for k in range(lo + BLOCK, hi + BLOCK, BLOCK):
        nxt = k + tl.arange(0, BLOCK)
        x_next = tl.load(row + nxt, mask=nxt < hi, other=float("-inf")).to(tl.float32)
        better = x > best_v
        best_i = tl.where(better, offs, best_i)
        best_v = tl.where(better, x, best_v)
        x, offs = x_next, nxt
    best = tl.max(best_v, 0)
    best_i = tl.min(tl.where(best_v == best, best_i, V), 0)
    best_v = best
    if MERGE_P2 == 1:       # one split: this program owns the row
        tl.store(out_ptr + m, best_i.to(tl.int64))
    else:
        part = m * splits + s
        tl.store(pv_ptr + part, best_v)
        tl.store(pi_ptr + part, best_i)
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + m, 1, sem="acq_rel", scope="gpu")
        if done == splits - 1:
            tl.store(cnt_ptr + m, 0)
            offs_s = tl.arange(0, MERGE_P2)
            vals = tl.load(pv_ptr + m * splits + offs_s, mask=offs_s < splits,
                           other=float("-inf"), cache_modifier=".cg")
            _, j = tl.max(vals, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.load(pi_ptr + m * splits + j, cache_modifier=".cg")
            tl.store(out_ptr + m, tok.to(tl.int64))


def plan_splits(rows: int, vocab: int, sms: int) -> tuple[int, int]:
    """(splits per row, logits per split): enough programs to cover the GPU, each with
    whole tiles to scan."""
    tiles = triton.cdiv(vocab, BLOCK)
    want = max(1, min(tiles, triton.cdiv(PROGRAMS_PER_SM * sms, max(rows, 1))))
    chunk = triton.cdiv(tiles, want) * BLOCK
    return triton.cdiv(vocab, chunk), chunk


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) of a 2-D [M, V] float tensor -> int64 [M]."""
    assert logits.dim() == 2 and logits.stride(-1) == 1, logits.shape
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    splits, chunk = plan_splits(rows, vocab, num_sms(logits.device))
    pv = torch.empty((rows, splits), dtype=torch.float32, device=logits.device)
    pi = torch.empty((rows, splits), dtype=torch.int32, device=logits.device)
    cnt = zeroed_scratch(logits.device, "argmax_counters", rows, torch.int32)
    _argmax_kernel[(rows, splits)](logits, out, pv, pi, cnt, vocab, chunk, splits,
                                   logits.stride(0), MERGE_P2=triton.next_power_of_2(splits),
                                   BLOCK=BLOCK, num_warps=4, **pdl.launch_args(logits.device))
    return out

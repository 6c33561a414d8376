"""decode_order: the decode rows longest context first, for the decode attention's
`order` (docs/KERNELS.md "Longest first"), in one launch.

Row i's place is its rank: the rows with a longer context, or an equal one and a lower
index, come before it (a stable descending sort). Each program ranks BLOCK rows against
all n in BLOCK-wide chunks and writes order[rank] = i. torch.argsort took a copy, an
index fill, the sort and a cast to int32: four launches, on the critical path of every
decode step at batch >= 2 (inside the CUDA graph, before the first layer's attention).
Launched without PDL: the decode kernel reads `order` before its own PDL wait, so this
launch must have completed when that one starts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 64


@triton.jit(do_not_specialize=["n"])
def _order_kernel(lens_ptr, order_ptr, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mine = rows < n
    own = tl.load(lens_ptr + rows, mask=mine, other=0)
    rank = tl.zeros([BLOCK], tl.int32)
    for j0 in range(0, n, BLOCK):
        others = j0 + tl.arange(0, BLOCK)
        theirs = tl.load(lens_ptr + others, mask=others < n, other=0)
        first = (theirs[None, :] > own[:, None]) | (
            (theirs[None, :] == own[:, None]) & (others[None, :] < rows[:, None]))
        rank += tl.sum((first & (others < n)[None, :]).to(tl.int32), 1)
    tl.store(order_ptr + rank, rows, mask=mine)


def decode_order(context_lens: torch.Tensor) -> torch.Tensor | None:
    """The decode rows [B] int32 longest context first (ties in row order), made once a
    forward on the device and shared by every layer; None at batch 1, where nothing is
    to order."""
    n = context_lens.shape[0]
    if n < 2:
        return None
    order = torch.empty(n, dtype=torch.int32, device=context_lens.device)
    _order_kernel[(triton.cdiv(n, BLOCK),)](context_lens, order, n, BLOCK=BLOCK)
    return order

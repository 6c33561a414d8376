"""A grammar's token bitmask applied to logits rows: disallowed tokens become -inf.

The bitmask is packed (llguidance's and xgrammar's layout): row i holds ceil(V / 32)
int32 words, bit b of word w allows token 32 w + b. Only the rows that carry a grammar
are touched (`rows`: their indices in the logits); tokens past the mask's width are
disallowed. In place on a float32 tensor the sampler owns (never a CUDA graph's output
buffer). Triton on CUDA (one program per (row, tile of BLOCK tokens): it reads the row's
words once and writes only what it masks), the torch reference elsewhere.
"""
from __future__ import annotations

import torch

BLOCK = 4096        # tokens a program covers (128 words)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor,
                            rows: torch.Tensor) -> None:
    """logits [R, V] float32 (in place); bitmask [C, W] int32; rows [C] int64 < R."""
    if rows.numel() == 0:
        return
    vocab = logits.shape[1]
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().reshape(bitmask.shape[0], -1)
    width = allowed.shape[1]
    if width < vocab:      # tokens past the mask: never allowed
        allowed = torch.cat((allowed, allowed.new_zeros(allowed.shape[0], vocab - width)), 1)
    sub = logits.index_select(0, rows).masked_fill_(~allowed[:, :vocab], float("-inf"))
    logits.index_copy_(0, rows, sub)


def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(logits_ptr, mask_ptr, rows_ptr, V, W, stride_l, stride_m,
               BLOCK: tl.constexpr):
        c = tl.program_id(0)
        t = tl.program_id(1)
        row = tl.load(rows_ptr + c)
        offs = t * BLOCK + tl.arange(0, BLOCK)
        words = tl.load(mask_ptr + c * stride_m + offs // 32, mask=offs < W * 32, other=0)
        allowed = ((words >> (offs % 32)) & 1) != 0
        ptrs = logits_ptr + row.to(tl.int64) * stride_l + offs
        tl.store(ptrs, float("-inf"), mask=(offs < V) & ~allowed)

    return kernel


_KERNEL = None


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                        rows: torch.Tensor) -> None:
    """The Triton kernel on CUDA, the reference on the CPU (the kernel's tests run it
    under TRITON_INTERPRET there)."""
    if logits.is_cuda:
        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        apply_token_bitmask_ref(logits, bitmask, rows)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               rows: torch.Tensor) -> None:
    global _KERNEL
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1, logits.dtype
    assert bitmask.dtype == torch.int32 and bitmask.is_contiguous()
    count = rows.shape[0]
    if count == 0:
        return
    if _KERNEL is None:
        _KERNEL = _triton_kernel()
    vocab = logits.shape[1]
    grid = (count, -(-vocab // BLOCK))
    _KERNEL[grid](logits, bitmask, rows, vocab, bitmask.shape[1], logits.stride(0),
                  bitmask.stride(0), BLOCK=BLOCK)

"""copy_decode_inputs: a decode-only step's inputs from pinned host staging into the
decode graphs' device buffers, in one launch.

A batch-1 decode step has four small inputs (token ids | positions | slots, context
lengths, block-table rows, and the ids fed from the previous step's samples). As four
copies, each a kernel through the staging's device view (engine/worker/device_io.py), they
left ~14 us of the GPU between two decode graphs to launch gaps (scripts/
step_timeline.py). Here program p copies row p of each: reads pinned host memory
directly (the staging's device view), writes the device buffers; `fed` (the previous
step's samples on the device, rows in order) replaces the ids of rows < d. The table
rows are left out (table=False) when they are too large for reads over the bus to beat
a memcpy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_W = 512           # table entries per step of a row's copy
_COMPILED: dict[tuple, object] = {}     # _direct_key(...) -> compiled kernel


# No int is specialized on (1, divisible by 16): the batch size and the fed count change
# from step to step, and each specialization would be a compile mid-serving.
@triton.jit(do_not_specialize=["P", "W", "d", "stride_src_table", "stride_dst_table"])
def _decode_inputs_kernel(src_tok, src_lens, src_table, dst_tok, dst_lens, dst_table, fed,
                          P, W, d, stride_src_table, stride_dst_table,
                          FED: tl.constexpr, TABLE: tl.constexpr, BLOCK_W: tl.constexpr):
    p = tl.program_id(0)
    ids = tl.load(src_tok + p)
    if FED:
        ids = tl.where(p < d, tl.load(fed + p, mask=p < d, other=0), ids)
    tl.store(dst_tok + p, ids)
    tl.store(dst_tok + P + p, tl.load(src_tok + P + p))
    tl.store(dst_tok + 2 * P + p, tl.load(src_tok + 2 * P + p))
    tl.store(dst_lens + p, tl.load(src_lens + p))
    if TABLE:
        p64 = p.to(tl.int64)
        for w0 in range(0, W, BLOCK_W):
            offs = w0 + tl.arange(0, BLOCK_W)
            row = tl.load(src_table + p64 * stride_src_table + offs, mask=offs < W)
            tl.store(dst_table + p64 * stride_dst_table + offs, row, mask=offs < W)


def copy_decode_inputs(src_tok: torch.Tensor, src_lens: torch.Tensor, src_table: torch.Tensor,
                       dst_tok: torch.Tensor, dst_lens: torch.Tensor, dst_table: torch.Tensor,
                       fed: torch.Tensor | None = None, table: bool = True) -> None:
    """dst_tok[:3P] = src_tok (ids | positions | slots of P rows), with ids[:len(fed)] =
    fed; dst_lens[:P] = src_lens; dst_table[:P] = src_table (if table). Sources: device
    views of pinned host memory (or device tensors)."""
    rows = dst_lens.shape[0]
    assert src_tok.shape[0] == dst_tok.shape[0] == 3 * rows and src_lens.shape[0] == rows
    assert src_table.shape == dst_table.shape and src_table.stride(-1) == 1
    d = 0 if fed is None else fed.shape[0]
    args = (src_tok, src_lens, src_table, dst_tok, dst_lens, dst_table,
            dst_tok if fed is None else fed, rows, src_table.shape[1], d,
            src_table.stride(0), dst_table.stride(0))
    key = _direct_key(args, fed is not None, table)
    if key is not None and _launch_compiled(key, rows, args):
        return
    kernel = _decode_inputs_kernel[(rows,)](*args, FED=fed is not None, TABLE=table,
                                            BLOCK_W=BLOCK_W, num_warps=1)
    if key is not None:
        _COMPILED[key] = kernel


def _direct_key(args: tuple, fed: bool, table: bool) -> tuple | None:
    """What Triton compiles this kernel for: the constexprs, each pointer's dtype and
    16-byte alignment (no int is specialized; all stay far below 2**31, so every one is
    an i32), or None: no direct launch."""
    hooks = triton.knobs.runtime
    if not args[0].is_cuda or _hooked(hooks.launch_enter_hook) \
            or _hooked(hooks.launch_exit_hook):
        return None     # (a profiler's launch hooks need Triton's own launch metadata)
    return (fed, table, args[0].get_device()) + tuple(
        (t.dtype, t.data_ptr() % 16 == 0) for t in args[:7])


def _hooked(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def _launch_compiled(key: tuple, rows: int, args: tuple) -> bool:
    """Launch the kernel compiled for `key` directly: Triton's per-call dispatch (binding
    the arguments, the cache key) costs the host more than the launch. False: none yet."""
    kernel = _COMPILED.get(key)
    if kernel is None:
        return False
    stream = triton.runtime.driver.active.get_current_stream(key[2])
    kernel.run(rows, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None,
               *args, key[0], key[1], BLOCK_W)
    return True

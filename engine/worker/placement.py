"""Where and in what precision the engine runs: the device and dtype knobs resolved."""
from __future__ import annotations

import ctypes
import math
import sys

import torch

from engine.config import InvalidRequestError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device 'cuda' requested but no CUDA GPU is available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def kv_cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The KV cache, zeroed. On a Linux CPU its memory is asked for in transparent huge
    pages (madvise, before the first touch): a decode step reads every sequence's blocks
    scattered over hundreds of MB, and with 4 KB pages those reads miss the TLB (one
    in-process timing of the bundled model's native attention: 1.26 -> 1.04 ms a step).
    Elsewhere, or where madvise is refused, plain torch.zeros."""
    if device.type != "cpu" or sys.platform != "linux":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    offset = -raw.data_ptr() % HUGE_PAGE
    cache = raw[offset:offset + nbytes].view(dtype).view(shape)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(raw.data_ptr() + offset),
                     ctypes.c_size_t(nbytes // HUGE_PAGE * HUGE_PAGE), _MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass                                # a hint only: 4 KB pages work the same
    return cache.zero_()


def blocks_from_memory(device: torch.device, bytes_per_block: int,
                       gpu_memory_utilization: float) -> int:
    """KV blocks that fit the GPU's memory at the utilization, after what is in use and a
    reserve."""
    free, total = torch.cuda.mem_get_info(device)
    reserve = 2 * 1024 ** 3  # activations, logits, CUDA graphs
    budget = total * gpu_memory_utilization - (total - free) - reserve
    return max(16, int(budget // bytes_per_block))


def attach_kv_cache(model, ops, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """A paged KV cache [2, layers, blocks, block_size, kv_heads, head_dim] for the
    model's attention layers, each layer given its K and V views and the ops (the
    target's ModelRunner and the draft's DraftRunner each own one)."""
    model.ops = ops
    layers = model.attention_layers()
    first = layers[0]
    kv_cache = kv_cache_zeros((2, len(layers), num_blocks, block_size,
                               first.num_kv_heads, first.head_dim), dtype, device)
    for i, layer in enumerate(layers):
        layer.ops = ops
        layer.k_cache, layer.v_cache = kv_cache[0, i], kv_cache[1, i]
    return kv_cache

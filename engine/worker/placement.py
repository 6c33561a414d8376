"""Where and in what precision the engine runs: the device, dtype and kv_cache_dtype knobs
resolved, and the KV pool allocated (its dtype and, for fp8, its per-head scales)."""
from __future__ import annotations

import ctypes
import math
import sys

import torch

from engine.config import InvalidRequestError
from kernels.kv_quant import FP8_DTYPE, is_fp8

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


def resolve_kv_cache_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV pool's dtype: the model's (auto), or float8 e4m3 (fp8, fp8_e4m3). On CUDA
    fp8 needs compute capability 8.9 (Ada, Hopper): the e4m3 conversions of the Triton
    kernels do not exist before it."""
    if name == "auto":
        return dtype
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise InvalidRequestError("kv_cache_dtype fp8 needs a GPU of compute capability 8.9 "
                                  "or newer (Ada, Hopper)")
    return FP8_DTYPE


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


def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of the model's KV pool in `dtype` (every layer, K and V; an fp8
    pool's scales are per layer and head, not per block)."""
    layers = model.attention_layers()
    return (2 * len(layers) * block_size * layers[0].num_kv_heads * layers[0].head_dim
            * dtype.itemsize)


def attach_kv_cache(model, ops, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(cache, scales): a paged KV cache [2, layers, blocks, block_size, kv_heads,
    head_dim] of `dtype` for the model's attention layers, each layer given its K and V
    views and the ops (the target's ModelRunner and the draft's DraftRunner each own
    one). An fp8 pool also has scales, [2, layers, kv_heads] float32 ones (K then V;
    calculate_kv_scales overwrites them in place), else None: a property of the pool,
    like its dtype, not of any block."""
    model.ops = ops
    layers = model.attention_layers()
    first = layers[0]
    kv_cache = kv_cache_zeros((2, len(layers), num_blocks, block_size,
                               first.num_kv_heads, first.head_dim), dtype, device)
    scales = None
    if is_fp8(dtype):   # each layer's row starts 16-byte aligned: the kernels compiled at
        h = first.num_kv_heads      # start-up (layer 0's) serve every layer's pointers
        scales = torch.ones(2, len(layers), -(-h // 4) * 4, dtype=torch.float32,
                            device=device)[..., :h]
    for i, layer in enumerate(layers):
        layer.ops = ops
        layer.k_cache, layer.v_cache = kv_cache[0, i], kv_cache[1, i]
        layer.set_kv_scales(None if scales is None else scales[0, i],
                            None if scales is None else scales[1, i])
    return kv_cache, scales


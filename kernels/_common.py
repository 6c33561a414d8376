"""Small host-side helpers shared by the Triton kernel wrappers (no kernels here)."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.kv_quant import FP8_DTYPE

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16,
              torch.bfloat16: tl.bfloat16}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else triton.next_power_of_2(int(n))


def check_float(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype not in _TL_DTYPES:
            raise TypeError(f"unsupported dtype {t.dtype}; use float32, float16 or bfloat16")


def check_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None,
             v_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The paged caches' dtype checked (a float dtype, or float8_e4m3fn for both);
    returns (k_scale, v_scale, fp8) as the kernels take them: an fp8 cache's [H_kv]
    float32 scales (unit scales where None), else placeholder pointers never read."""
    if k_cache.dtype == FP8_DTYPE or v_cache.dtype == FP8_DTYPE:
        if k_cache.dtype != v_cache.dtype:
            raise TypeError(f"K and V caches differ: {k_cache.dtype} vs {v_cache.dtype}")
        for c in (k_cache, v_cache):    # V is read as 16-byte vectors of int16 pairs
            if c.stride(-1) != 1 or any(st % 16 for st in c.stride()[:-1]) \
                    or c.data_ptr() % 16:
                raise ValueError("an fp8 cache needs contiguous rows at 16-byte offsets "
                                 f"(head_dim a multiple of 16), got strides {c.stride()}")
        heads = k_cache.shape[2]
        scales = [unit_scales(k_cache.device, heads) if s is None else s
                  for s in (k_scale, v_scale)]
        for s in scales:
            if s.dtype != torch.float32 or s.shape != (heads,) or s.stride(0) != 1:
                raise ValueError(f"KV scales must be float32 [{heads}] (one per KV head), "
                                 f"got {s.dtype} {tuple(s.shape)}")
        return scales[0], scales[1], True
    check_float(k_cache, v_cache)
    if k_scale is not None or v_scale is not None:
        raise ValueError("KV scales apply to an fp8 cache only")
    return k_cache, v_cache, False


_UNIT: dict[tuple, torch.Tensor] = {}


def unit_scales(device: torch.device, heads: int) -> torch.Tensor:
    """A persistent float32 [heads] tensor of ones (an fp8 cache given no scales)."""
    key = (device, heads)
    if key not in _UNIT:
        _UNIT[key] = torch.ones(heads, dtype=torch.float32, device=device)
    return _UNIT[key]


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 for float32 inputs (the reference accumulates
    in fp32 with no tf32), the native tensor-core path for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (cached; no device sync). CPU (interpreter): a small number."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


_SCRATCH: dict[tuple, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []     # outgrown buffers stay alive: graphs may use them


def zeroed_scratch(device: torch.device, name: str, numel: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """A persistent zero-filled buffer of at least `numel` elements, one per (device, name).

    For kernels that keep counters or accumulators which every launch leaves zeroed again
    (so no memset is needed per call). Grows only outside CUDA-graph capture: a capture
    needs the kernels warmed up first anyway, which sizes the buffer (a zeros() inside a
    capture would only run at replay, leaving it uninitialised for eager calls).
    """
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, name, dtype)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"scratch {name!r} must grow to {numel} during CUDA-graph "
                               "capture: run the op once (warm-up) before capturing")
        if buf is not None:
            _RETIRED.append(buf)
        size = max(numel, 4096 if buf is None else 2 * buf.numel())
        buf = torch.zeros(size, dtype=dtype, device=device)
        _SCRATCH[key] = buf
    return buf

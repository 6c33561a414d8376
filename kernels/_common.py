"""Small host-side helpers shared by the Triton kernel wrappers (no kernels here)."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16,
              torch.bfloat16: tl.bfloat16}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else triton.next_power_of_2(int(n))


def check_float(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype not in _TL_DTYPES:
            raise TypeError(f"unsupported dtype {t.dtype}; use float32, float16 or bfloat16")


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

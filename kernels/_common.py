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

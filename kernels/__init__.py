"""Kernels: Triton implementations and their plain-torch references.

`get_ops("torch")` returns the reference module; `get_ops("triton")` returns the Triton
module; `get_ops("torch_sdpa")` returns the CPU backend (kernels/cpu_ops.py: batched
SDPA paged attention, oneDNN linears on packed weights, fewer-op rotary/norm/SiLU);
`get_ops("cpu_native")` that backend with a decode step's linears and attention in C
(kernels/cpu_native.py).
All expose the same functions with the same signatures: store_kv_cache,
paged_decode_attention, paged_extend_attention, rms_norm, rotary_embedding,
silu_and_mul, linear, rms_norm_linear, silu_mul_linear, rotary_store_kv,
rotary_decode_attention, argmax, top_logprobs. The Triton module also has decode_order
(the order its decode launch runs sequences in, docs/KERNELS.md "Longest first"); a
backend without it is called without an order.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

from kernels import reference

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"   # Triton's CPU interpreter, set
#                                                          before Triton is imported
if INTERPRETED:
    from kernels import interpreter
    interpreter.patch()

_BACKENDS = {"torch": "kernels.reference", "triton": "kernels.triton_ops",
             "torch_sdpa": "kernels.cpu_ops", "cpu_native": "kernels.cpu_native"}


def get_ops(name: str) -> ModuleType:
    if name not in _BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose from {sorted(_BACKENDS)}")
    return importlib.import_module(_BACKENDS[name])


def default_cpu_backend() -> str:
    """cpu_native where its C kernels build with vectors of 8 or 16 floats (AVX2 + FMA +
    F16C, or AVX-512: kernels/cpu_native_build.py), else torch_sdpa (the 4-float build of
    other CPUs is not measured against oneDNN; it is there for correctness)."""
    from kernels.cpu_native_build import load
    lib = load()
    return "cpu_native" if lib is not None and lib.rp_vector_width() >= 8 else "torch_sdpa"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


__all__ = ["default_cpu_backend", "get_ops", "reference", "triton_available"]

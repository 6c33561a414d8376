"""Programmatic dependent launch (PDL, Hopper and newer): a kernel starts while the one
before it on the stream is still finishing.

At batch 1 a decode step is ~150 small kernels, each bound by how fast its weights
stream from memory, and each pays a launch and a ramp before its loads are in flight.
A kernel launched with `launch_pdl=True` may be scheduled as soon as every program of
its predecessor has called `gdc_launch_dependents`, so its launch and prologue overlap
the predecessor's tail. Protocol, in every kernel that takes part (`pdl_enter` first):

  1. `gdc_wait()` before any load or store: it returns once the predecessor has completed
     and its writes are visible (stores must wait too: a predecessor may still read
     memory that this kernel's outputs reuse);
  2. `gdc_launch_dependents()` right after, so at most two kernels are in flight.

Kernels launched without PDL (cuBLAS, torch ops) serialize as usual, so a chain may mix
them freely. CUDA-graph capture keeps PDL launches as programmatic edges. Measured in
docs/KERNELS.md (batch-1 replay 0.887 -> 0.805 ms on an H100); prefetching the next
GEMV's weights into L2 before the wait was tried there and gained nothing.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels import INTERPRETED



@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """PDL on this device: CUDA compute capability >= 9.0, not the interpreter (cached:
    it is asked at every launch)."""
    if INTERPRETED or device.type != "cuda":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_args(device: torch.device) -> dict:
    """The kernel's PDL constexpr and, when on, the launch option: `**launch_args(dev)`."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the predecessor kernel, then let the successor launch (no-op without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

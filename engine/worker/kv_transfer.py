"""The host KV tier's memory and the copies between it and the device pool (worker side).

`HostKVCache` owns a second pool of blocks in the device pool's layout ([2, layers,
host blocks, block_size, kv_heads, head_dim]; pinned on CUDA, plain host memory on a CPU
run, so every path of the tier runs in CI) and runs one step's `KVTransfer`: the blocks
the core moves between the tiers, batched, one gather and one scatter each way.

On CUDA the PCIe part of each direction runs on a copy stream of its own, as kernels that
read or write the pinned pool through a CUDA view of it (engine/worker/device_io.py's
device_alias), and the device-local part on the compute stream:
  reload   copy stream: gather the host blocks into a device buffer (a PCIe read; it
           waits for nothing on the compute stream); compute stream: wait for that
           copy, then scatter the buffer into the device blocks, before the forward
           that reads them (the step waits for the blocks it reads, no more).
  offload  compute stream: gather the device blocks into a device buffer (HBM speed,
           ordered after every step that wrote them); copy stream: wait for that gather,
           then scatter the buffer into the host blocks (a PCIe write) while the forward
           runs: the forward may overwrite those device blocks at once.
One stream for every host-pool access orders them across steps: a host block written by
an offload is read by a later reload only after the write, and is rewritten by a later
offload only after an earlier reload read it. Within a step no host block is both read
and written (the core holds a reload's source until the step's copies are sent), and the
offload gathers come before the reload scatters on the compute stream, so a device block
that is both evicted (offload source) and reused as a reload destination in one step is
read before it is overwritten. Copies are issued reload read first (the step waits for
it: the sooner it starts the better), then offload gather and write, then reload
scatter. A step whose buffers would pass STAGING_BYTES (a long request swapped out or
in) runs in slices of that size, offloads first, so the device buffers stay bounded.
The core never reads the pool's bytes.

The bytes move as words (int64 where a head's row allows), so any KV dtype (bfloat16,
float32, float8) takes the same kernels, and wider words make fuller PCIe writes.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from engine.worker.device_io import to_device

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
_TYPESTR = {torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.uint8: "|u1"}
OFFLOAD, RELOAD = 0, 1     # directions: device -> host (GPU_to_CPU), host -> device
STAGING_BYTES = 256 << 20  # the largest device buffer a step's copies take at once


@dataclass(frozen=True)
class KVTransfer:
    """One step's copies between the tiers (block ids; the core builds it, every rank
    runs it on its own shard of both pools)."""
    offload_src: np.ndarray     # [O] int64 device blocks ...
    offload_dst: np.ndarray     # [O] int64 ... copied into these host blocks
    reload_src: np.ndarray      # [R] int64 host blocks ...
    reload_dst: np.ndarray      # [R] int64 ... copied into these device blocks

    def __bool__(self) -> bool:
        return bool(self.offload_src.shape[0] or self.reload_src.shape[0])


def word_view(kv: torch.Tensor) -> torch.Tensor:
    """The KV tensor as the widest integer words its last dimension's bytes divide into."""
    row = kv.shape[-1] * kv.element_size()
    word = next(w for w in _WORDS if row % w.itemsize == 0)
    return kv.view(torch.uint8).view(word) if kv.dtype != word else kv


class _CudaView:
    """__cuda_array_interface__ of a pinned tensor (kept alive by this object)."""

    def __init__(self, pinned: torch.Tensor):
        self.owner = pinned
        self.__cuda_array_interface__ = {
            "shape": tuple(pinned.shape), "typestr": _TYPESTR[pinned.dtype],
            "data": (pinned.data_ptr(), False), "version": 2, "strides": None}


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """(page-locked host memory of exactly this size, whether this function registered it:
    unregister it before it is freed). torch's pinned allocator rounds a request up to a
    power of two (20 GiB would lock 32), so the memory is allocated plainly and registered
    with the driver; where registering fails, torch's pinned allocator."""
    host = torch.empty(shape, dtype=dtype)
    cudart = torch.cuda.cudart()
    if int(cudart.cudaHostRegister(host.data_ptr(), host.numel() * host.element_size(), 0)):
        return torch.empty(shape, dtype=dtype, pin_memory=True), False
    return host, True


class HostKVCache:
    """The host pool of one rank and its copies (see the module docstring)."""

    def __init__(self, kv_cache: torch.Tensor, num_blocks: int):
        self.device = kv_cache.device
        self.num_blocks = num_blocks
        self.kv = word_view(kv_cache)                     # the device pool, as words
        shape = (*self.kv.shape[:2], num_blocks, *self.kv.shape[3:])
        cuda = self.device.type == "cuda"
        self.stream = self.view = None
        if cuda:        # never read before written: no fill
            self.host, registered = pinned_empty(shape, self.kv.dtype)
            if registered:     # the pages are locked until the pool is dropped
                weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister,
                                 self.host.data_ptr())
            self.stream = torch.cuda.Stream(self.device)
            # the pool as the GPU sees it: the copy kernels read and write host memory
            with torch.cuda.device(self.device):
                self.view = torch.as_tensor(_CudaView(self.host), device=self.device)
        else:
            self.host = torch.empty(shape, dtype=self.kv.dtype)
        self.bytes_per_block = self.host[:, :, :1].numel() * self.host.element_size()
        self._timings: list[tuple[int, object, object]] = []   # CUDA: (direction, start, end)
        self.seconds = [0.0, 0.0]      # copy time by direction, of the copies done so far

    def transfer(self, xfer: KVTransfer) -> None:
        """Queue (CUDA) or run (CPU) one step's copies, in the order the docstring gives."""
        if self.stream is None:
            self._transfer_cpu(xfer)
            return
        self._collect()
        for part in self._slices(xfer):
            self._transfer_cuda(part)

    def _slices(self, xfer: KVTransfer) -> list[KVTransfer]:
        """The step's copies in parts whose buffers fit STAGING_BYTES: all at once, or
        the offloads' slices then the reloads' (every gather before any scatter)."""
        n = max(1, STAGING_BYTES // self.bytes_per_block)
        if max(xfer.offload_src.shape[0], xfer.reload_src.shape[0]) <= n:
            return [xfer]
        none = xfer.offload_src[:0]
        return [KVTransfer(xfer.offload_src[i:i + n], xfer.offload_dst[i:i + n], none, none)
                for i in range(0, xfer.offload_src.shape[0], n)] + \
            [KVTransfer(none, none, xfer.reload_src[i:i + n], xfer.reload_dst[i:i + n])
             for i in range(0, xfer.reload_src.shape[0], n)]

    def _transfer_cuda(self, xfer: KVTransfer) -> None:
        compute = torch.cuda.current_stream(self.device)
        reloaded = reload_done = None
        if xfer.reload_src.shape[0]:
            with torch.cuda.stream(self.stream):     # its index copy on this stream too
                start = self._mark()
                src = to_device(xfer.reload_src, torch.int64, self.device)
                reloaded = self.view.index_select(2, src)           # PCIe read
                reload_done = self._mark()
                self._timings.append((RELOAD, start, reload_done))
            reloaded.record_stream(compute)
        if xfer.offload_src.shape[0]:
            src = to_device(xfer.offload_src, torch.int64, self.device)
            dst = to_device(xfer.offload_dst, torch.int64, self.device)
            gathered = self.kv.index_select(2, src)                # compute stream
            self.stream.wait_stream(compute)
            with torch.cuda.stream(self.stream):
                start = self._mark()
                self.view.index_copy_(2, dst, gathered)            # PCIe write
                self._timings.append((OFFLOAD, start, self._mark()))
            gathered.record_stream(self.stream)
            dst.record_stream(self.stream)
        if reloaded is not None:
            compute.wait_event(reload_done)
            self.kv.index_copy_(2, to_device(xfer.reload_dst, torch.int64, self.device),
                                reloaded)

    def _transfer_cpu(self, xfer: KVTransfer) -> None:
        t0 = time.perf_counter()
        reloaded = None
        if xfer.reload_src.shape[0]:
            reloaded = self.host.index_select(2, torch.from_numpy(xfer.reload_src))
        t1 = time.perf_counter()
        if xfer.offload_src.shape[0]:
            self.host.index_copy_(2, torch.from_numpy(xfer.offload_dst),
                                  self.kv.index_select(2, torch.from_numpy(xfer.offload_src)))
        t2 = time.perf_counter()
        if reloaded is not None:
            self.kv.index_copy_(2, torch.from_numpy(xfer.reload_dst), reloaded)
        self.seconds[RELOAD] += t1 - t0 + time.perf_counter() - t2
        self.seconds[OFFLOAD] += t2 - t1

    def _mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def _collect(self) -> None:
        """Add the copy time of CUDA copies that have completed (never waits)."""
        while self._timings and self._timings[0][2].query():
            direction, start, end = self._timings.pop(0)
            self.seconds[direction] += start.elapsed_time(end) / 1e3

    def copy_seconds(self) -> tuple[float, float]:
        """(offload, reload) seconds spent copying so far (CUDA: of completed copies)."""
        if self.stream is not None:
            self._collect()
        return self.seconds[OFFLOAD], self.seconds[RELOAD]

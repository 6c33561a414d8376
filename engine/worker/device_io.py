"""Host <-> device transfers that never wait on the stream.

A copy from pageable host memory, or a blocking `.tolist()` of a device tensor, is
ordered after everything already queued on the stream, so in an overlapped step it
would wait for the step in flight. These helpers go through pinned memory instead.

Small copies between pinned memory and the device run as a kernel through a CUDA view
of the pinned buffer (`device_alias`: pinned memory is addressable from the GPU), not
as a cudaMemcpy: at batch 1 each memcpy between two kernels left the GPU idle 1-9 us
while the stream handed over to a copy engine and back (scripts/step_timeline.py: ~27
us from one decode graph to the next, five copies).
"""
from __future__ import annotations

import time

import numpy as np
import torch

KERNEL_COPY_MAX_BYTES = 1 << 16  # larger copies stay on the copy engine (bandwidth)
_TYPESTR = {torch.int64: "<i8", torch.int32: "<i4", torch.float32: "<f4"}


class _CudaArray:
    """__cuda_array_interface__ of a pinned tensor (kept alive by this object)."""

    def __init__(self, pinned: torch.Tensor):
        self.owner = pinned
        self.__cuda_array_interface__ = {
            "shape": tuple(pinned.shape), "typestr": _TYPESTR[pinned.dtype],
            "data": (pinned.data_ptr(), False), "version": 2, "strides": None}


def device_alias(pinned: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """A CUDA tensor over the same pinned host memory (None if that cannot be made): a
    kernel writing it writes host memory, one reading it reads host memory."""
    if device.type != "cuda" or not pinned.is_pinned() or pinned.dtype not in _TYPESTR \
            or not pinned.is_contiguous():
        return None
    try:
        with torch.cuda.device(device):
            return torch.as_tensor(_CudaArray(pinned), device=device)
    except (RuntimeError, TypeError, ValueError):
        return None


def copy_(dst: torch.Tensor, src: torch.Tensor, src_alias: torch.Tensor | None = None,
          dst_alias: torch.Tensor | None = None) -> None:
    """dst.copy_(src, non_blocking=True); a small one between pinned host memory and the
    device runs as a kernel through the pinned side's alias (see above), and so does a
    small device-to-device one (no aliases needed)."""
    if dst.numel() * dst.element_size() <= KERNEL_COPY_MAX_BYTES:
        if src_alias is not None:
            src = src_alias
        elif dst_alias is not None:
            dst = dst_alias
        if src.is_cuda and dst.is_cuda:
            torch.add(src, 0, out=dst)      # an elementwise kernel (a copy_ is a memcpy)
            return
    dst.copy_(src, non_blocking=True)


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list/array as a device tensor, without a stream-ordered wait."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """A tensor on its way to host memory (HostCopyRing.start); read it later."""

    def __init__(self, host: torch.Tensor, event: "torch.cuda.Event | None" = None):
        self._tensor = host       # filled by a copy queued on the stream (event: its end)
        self._event = event
        self.read = False         # its ring slot may be reused once it is

    def tolist(self) -> list:
        """Waits for this copy only, not for work queued after it."""
        return self._arrived().tolist()

    def numpy(self) -> np.ndarray:
        """As tolist, a numpy copy (the ring may reuse the buffer once it is read)."""
        return self._arrived().numpy().copy()

    def _arrived(self) -> torch.Tensor:
        """The host tensor once its copy has landed (marked read)."""
        if self._event is not None:
            self._event.synchronize()
        self.read = True
        return self._tensor

    def wait_seconds(self) -> tuple[list, float]:
        """(values, seconds the host spent blocked on the device for them): the engine's
        one sync per step, so its sum is the time the host had nothing to do."""
        t0 = time.perf_counter()
        values = self.tolist()
        return values, time.perf_counter() - t0


class _Slot:
    __slots__ = ("buf", "alias", "event", "copy", "cuda", "views")

    def __init__(self):
        self.buf = self.alias = self.event = self.copy = None   # copy: its last HostCopy
        self.cuda = False
        self.views: dict[int, tuple] = {}    # n -> (buf[:n], alias[:n]): made once


_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def current_stream(device_index: int) -> "torch.cuda.Stream":
    """torch.cuda.current_stream(), one Stream object per raw stream (building one costs
    the host more than the event record it is for)."""
    key = (device_index, torch._C._cuda_getCurrentRawStream(device_index))
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.current_stream(device_index)
    return stream


class HostCopyRing:
    """Host buffers (pinned, for a device tensor) and CUDA events for HostCopy, allocated
    once and taken in turn: a pinned allocation and a new event every step cost the
    host more than the copy. A slot is reused only once its last copy was read (async
    scheduling leaves two unread at most: the step in flight and the one being read);
    a slot whose copy is still unread (a failed step's, never read) leaves its buffer
    and event to that copy and takes new ones, so no copy is ever overwritten."""

    def __init__(self, slots: int = 3, min_size: int = 256):
        self._slots = [_Slot() for _ in range(slots)]
        self._next = 0
        self._min_size = min_size
        self.allocations = 0      # buffers allocated: none in a steady loop

    def start(self, tensor: torch.Tensor) -> HostCopy:
        """Queue the copy of a 1-D tensor to the host now; read it with .tolist()."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        n, cuda, buf = tensor.shape[0], tensor.is_cuda, slot.buf
        if buf is None or buf.shape[0] < n or buf.dtype != tensor.dtype or slot.cuda != cuda \
                or not (slot.copy is None or slot.copy.read):
            slot.buf = buf = torch.empty(max(n, self._min_size), dtype=tensor.dtype,
                                         pin_memory=cuda)
            slot.alias = device_alias(buf, tensor.device) if cuda else None
            slot.event, slot.cuda = (torch.cuda.Event() if cuda else None), cuda
            slot.views = {}
            self.allocations += 1
        views = slot.views.get(n)
        if views is None:
            views = slot.views[n] = (buf[:n], None if slot.alias is None else slot.alias[:n])
        host, alias = views
        copy_(host, tensor, dst_alias=alias)
        if slot.event is not None:
            slot.event.record(current_stream(tensor.get_device()))
        slot.copy = HostCopy(host, slot.event)
        return slot.copy

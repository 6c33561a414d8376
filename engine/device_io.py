"""Host <-> device transfers that never wait on the stream.

A copy from pageable host memory, or a blocking `.tolist()` of a device tensor, is
ordered after everything already queued on the stream, so in an overlapped step it
would wait for the step in flight. These helpers go through pinned memory instead.
"""
from __future__ import annotations

import time

import torch


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
        if self._event is not None:
            self._event.synchronize()
        self.read = True
        return self._tensor.tolist()

    def wait_seconds(self) -> tuple[list, float]:
        """(values, seconds the host spent blocked on the device for them): the engine's
        one sync per step, so its sum is the time the host had nothing to do."""
        t0 = time.perf_counter()
        values = self.tolist()
        return values, time.perf_counter() - t0


class _Slot:
    __slots__ = ("buf", "event", "copy", "cuda")

    def __init__(self):
        self.buf = self.event = self.copy = None   # copy: the last HostCopy made in it
        self.cuda = False


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
            slot.event, slot.cuda = (torch.cuda.Event() if cuda else None), cuda
            self.allocations += 1
        host = buf[:n]
        host.copy_(tensor, non_blocking=True)
        if slot.event is not None:
            slot.event.record()
        slot.copy = HostCopy(host, slot.event)
        return slot.copy

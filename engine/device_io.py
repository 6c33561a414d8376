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
    """Start copying a device tensor to pinned host memory now; read it later."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor
        self._event = None
        if tensor.is_cuda:
            self._tensor = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._tensor.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def tolist(self) -> list:
        """Waits for this copy only, not for work queued after it."""
        if self._event is not None:
            self._event.synchronize()
        return self._tensor.tolist()

    def wait_seconds(self) -> tuple[list, float]:
        """(values, seconds the host spent blocked on the device for them): the engine's
        one sync per step, so its sum is the time the host had nothing to do."""
        t0 = time.perf_counter()
        values = self.tolist()
        return values, time.perf_counter() - t0

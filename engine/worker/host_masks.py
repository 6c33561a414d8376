"""Host buffers for the steps' grammar bitmasks, taken in turn, and the torch view of a
mask that a grammar library fills (xgrammar takes tensors): the core's structured
outputs (engine/core/structured/) fill them as numpy arrays and import no torch.

A step's mask is filled into one of three buffers (pinned on CUDA, so its copy to the
device does not wait for the stream) and must outlive two later fills: async scheduling
fills step N+1's mask (and may fill N+2's) before N's tokens are read, and the TUI's
view of step N reads its row then (engine/core/structured/view.py). Each step syncs on
its tokens, so by the time a buffer comes round again its copy has run.
"""
from __future__ import annotations

import numpy as np
import torch

SLOTS = 3


class MaskRing:
    def __init__(self, pinned: bool):
        self.pinned = pinned
        self._bufs: list[np.ndarray | None] = [None] * SLOTS
        self._keep: list[torch.Tensor | None] = [None] * SLOTS   # the pinned owners
        self._next = 0

    def take(self, rows: int, words: int) -> np.ndarray:
        """A [rows, words] int32 array (contents undefined) in the next buffer."""
        i = self._next
        self._next = (i + 1) % SLOTS
        buf = self._bufs[i]
        if buf is None or buf.shape[0] < rows or buf.shape[1] != words:
            n = max(rows, 64, 0 if buf is None else buf.shape[0] * 2)
            t = torch.empty((n, words), dtype=torch.int32, pin_memory=self.pinned)
            self._keep[i], buf = t, t.numpy()
            self._bufs[i] = buf
        return buf[:rows]


def tensor_view(array: np.ndarray) -> torch.Tensor:
    """A tensor over the same memory (a library writing it writes the array)."""
    return torch.from_numpy(array)

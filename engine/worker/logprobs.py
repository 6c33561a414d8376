"""The logprobs of a step's rows: taken on the device by the backend's top_logprobs (one
launch per view on the GPU, kernels/logprobs.py: each row's token and top n, their
values and the token's rank, packed into one int32 row), copied to the host in one
copy per view through a ring of pinned buffers, and unpacked into TokenLogprobs once
the step's tokens are read (docs/SAMPLING.md "Logprobs and logprobs_mode")."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from engine.outputs import TokenLogprobs
from engine.worker.device_io import HostCopy, HostCopyRing, to_device

TopLogprobs = Callable[..., torch.Tensor]    # the backend's top_logprobs


def take(top: TopLogprobs, src: torch.Tensor, tokens: torch.Tensor, idx: torch.Tensor,
         n: int, normalize: bool, gathered: bool = False) -> torch.Tensor:
    """The packed logprobs of sample rows `idx` (on the device, as tokens [R]): src's row
    idx[j], or its row j when `gathered` (src holds just those rows)."""
    return top(src, tokens.index_select(0, idx), n, normalize, None if gathered else idx)


def prompt_logprobs(top: TopLogprobs, logits: torch.Tensor, rows: np.ndarray,
                    targets: np.ndarray, n: int) -> torch.Tensor:
    """Prompt logprobs (engine/core/prompt_logprobs.py) of logits rows `rows` [P] of a
    step's logits, each predicting `targets` [P]: the model's own distribution (raw
    log-softmax, as vLLM's prompt logprobs), packed."""
    dev = logits.device
    return top(logits, to_device(targets, torch.int64, dev), n, True,
               to_device(rows, torch.int64, dev))


def unpack(packed: np.ndarray) -> tuple[list, list, list]:
    """A packed [L, 2n + 3] int32 array (kernels/logprobs.py LAYOUT) as Python lists:
    ids [L][n + 1], values [L][n + 1], ranks [L]."""
    n = (packed.shape[1] - 3) // 2
    return (packed[:, :n + 1].tolist(), packed[:, n + 1:2 * n + 2].view(np.float32).tolist(),
            packed[:, 2 * n + 2].tolist())


def unpack_tensor(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed tensor as (ids int64 [L, n + 1], values float32 [L, n + 1], ranks int64
    [L]) where it is (tests, readers on the device)."""
    n = (packed.shape[1] - 3) // 2
    return (packed[:, :n + 1].long(),
            packed[:, n + 1:2 * n + 2].contiguous().view(torch.float32),
            packed[:, 2 * n + 2].long())


class PackedCopy:
    """One packed tensor on its way to the host (through `ring`, else a pinned buffer of
    its own), read as numpy after the step's tokens."""

    def __init__(self, packed: torch.Tensor, ring: HostCopyRing | None = None):
        self.shape = packed.shape
        flat = packed.reshape(-1)
        self.copy = ring.start(flat) if ring is not None else _own_copy(flat)

    def array(self) -> np.ndarray:
        return self.copy.numpy().reshape(self.shape)


def _own_copy(t: torch.Tensor) -> HostCopy:
    if not t.is_cuda:
        return HostCopy(t)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return HostCopy(host, event)


class LogprobsCopy:
    """A step's logprobs on their way to the host (only the rows that asked): the
    sampled distribution's view and, for rows that asked raw_logprobs, the model's."""

    def __init__(self, packed: tuple, rows: np.ndarray, raw_rows: np.ndarray | None,
                 ring: HostCopyRing | None):
        self.copies = [PackedCopy(p, ring) for p in packed]
        self.rows, self.raw_rows = rows, raw_rows

    def per_row(self, requests: list) -> list[TokenLogprobs | None]:
        """One entry per sample row (requests[i]: row i), each cut to its own top-n."""
        ids, values, ranks = unpack(self.copies[0].array())
        raws = {}
        if len(self.copies) > 1:
            raw_ids, raw_values, raw_ranks = unpack(self.copies[1].array())
            raws = {j: (raw_ids[k], raw_values[k], raw_ranks[k])
                    for k, j in enumerate(self.raw_rows.tolist())}
        out: list[TokenLogprobs | None] = [None] * len(requests)
        for j, row in enumerate(self.rows.tolist()):
            n = requests[row].params.logprobs + 1
            r = raws.get(j)
            out[row] = TokenLogprobs(ids[j][:n], values[j][:n], ranks[j],
                                     r and TokenLogprobs(r[0][:n], r[1][:n], r[2]))
        return out

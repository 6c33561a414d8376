"""Presence, frequency and repetition penalties from token counts held on the device.

Each request that uses a penalty gets a slot (by request id, until `release`): a row of
`counts` [slots, V] int32 (how often each token was sampled for it) and of `in_prompt`
[slots, V] bool. The counts grow on the device from each step's sampled tokens (one
accumulate-scatter of one entry per penalty row), so the host never sends output
tokens, and async scheduling (whose next step is planned before the tokens are read)
needs nothing more. A slot is reset from the prompt at the request's first sample.

Why not vLLM's per-step bincount of padded token ids: that sends [P, longest output]
ids to the device every step and must know every output token on the host. On paper at
P = 256 rows x V = 151,936: the slots hold 256 x V x 5 B = 194 MB once; a step gathers
the rows (156 MB read as int32) and runs ~6 elementwise passes over [P, V] float32
(~156 MB each): ~1.1 GB of traffic, ~0.4 ms at an H100's ~3 TB/s, paid only on steps
where some row has a penalty. The bincount route moves the same [P, V] passes plus the
padded ids (256 x 2,048 x 8 B = 4 MB per step at 2k-token outputs).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.worker.device_io import to_device


class TokenCounts:
    def __init__(self, device: torch.device):
        self.device = device
        self.slots: dict[str, int] = {}
        self.free: list[int] = []
        self.counts: torch.Tensor | None = None      # [S, V] int32
        self.in_prompt: torch.Tensor | None = None   # [S, V] bool

    def release(self, request_id: str) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self.free.append(slot)

    def slots_of(self, request_ids: list[str], vocab: int) -> torch.Tensor:
        """The slots of these requests (new ones allocated), on the device."""
        out = []
        for rid in request_ids:
            slot = self.slots.get(rid)
            if slot is None:
                slot = self.free.pop() if self.free else len(self.slots)
                self.slots[rid] = slot
            out.append(slot)
        self._reserve(max(out) + 1, vocab)
        return to_device(out, torch.int64, self.device)

    def _reserve(self, n: int, vocab: int) -> None:
        have = 0 if self.counts is None else self.counts.shape[0]
        if n <= have:
            return
        size = max(n, 2 * have, 8)
        counts = torch.zeros((size, vocab), dtype=torch.int32, device=self.device)
        in_prompt = torch.zeros((size, vocab), dtype=torch.bool, device=self.device)
        if have:
            counts[:have] = self.counts
            in_prompt[:have] = self.in_prompt
        self.counts, self.in_prompt = counts, in_prompt

    def reset(self, slots: torch.Tensor, prompt_ids: np.ndarray, prompt_lens: np.ndarray) -> None:
        """Zero these slots' counts and mark their prompts' tokens (one scatter)."""
        self.counts.index_fill_(0, slots, 0)
        self.in_prompt.index_fill_(0, slots, False)
        lens = to_device(prompt_lens, torch.int64, self.device)
        rows = slots.repeat_interleave(lens)
        ids = to_device(prompt_ids, torch.int64, self.device)
        self.in_prompt.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.bool))

    def add(self, slots: torch.Tensor, tokens: torch.Tensor, n: int = 1) -> None:
        """Count one sampled token per slot (n -1: take back a failed launch's)."""
        self.counts.index_put_((slots, tokens), torch.full_like(tokens, n, dtype=torch.int32),
                               accumulate=True)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
              presence: np.ndarray, frequency: np.ndarray, repetition: np.ndarray) -> None:
        """vLLM's penalties on logits[rows] (float32, in place): repetition (HF/CTRL:
        a seen positive logit / penalty, a negative one x penalty) over prompt and
        output tokens, then OpenAI's frequency (x count) and presence (x seen) over
        output tokens. A kind no row of the step uses costs no pass over [P, V]."""
        dev = logits.device
        x = logits.index_select(0, rows)
        counts = self.counts.index_select(0, slots)
        if (repetition != 1).any():
            seen = self.in_prompt.index_select(0, slots) | (counts > 0)
            penalty = torch.where(seen, to_device(repetition, torch.float32, dev)[:, None], 1.0)
            x = torch.where(x > 0, x / penalty, x * penalty)
        if (frequency != 0).any():
            x -= to_device(frequency, torch.float32, dev)[:, None] * counts
        if (presence != 0).any():
            x -= to_device(presence, torch.float32, dev)[:, None] * (counts > 0)
        logits.index_copy_(0, rows, x)

"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Reads only the step batch's sampling columns. One host sync per step (the final token
list, taken by the caller), never one per request. Random rows draw from an exponential
race (argmax of p / E, E ~ Exp(1)), which samples exactly from p; a seeded request draws
its noise from its own generator (kept here by request id until `release`), so its
output does not depend on what else is in the batch.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.worker.device_io import to_device
from engine.worker.step_batch import SamplingColumns


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}   # seeded requests, by id

    def release(self, request_id: str) -> None:
        """The request ended: drop its generator."""
        self.generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, cols: SamplingColumns) -> torch.Tensor:
        """logits [R, V] (model dtype), one row per sample -> token ids, on the device."""
        if cols.all_greedy:
            return logits.argmax(dim=-1)   # exact on bf16: no upcast needed
        logits = logits.float()
        greedy_tokens = logits.argmax(dim=-1)
        dev = logits.device
        scaled = logits / to_device(cols.temperature, torch.float32, dev)[:, None]
        scaled = self._top_k(scaled, cols.top_k)
        scaled = self._top_p(scaled, cols.top_p)
        probs = torch.softmax(scaled, dim=-1)
        noise = self._noise(probs, cols)
        random_tokens = (probs / noise).argmax(dim=-1)
        return torch.where(to_device(cols.greedy, torch.bool, dev), greedy_tokens, random_tokens)

    @staticmethod
    def _top_k(logits: torch.Tensor, top_k: np.ndarray) -> torch.Tensor:
        vocab = logits.shape[-1]
        ks = np.where(top_k > 0, np.minimum(top_k, vocab), vocab)
        if ks.min() >= vocab:
            return logits
        k_max = int(ks.max())
        top = torch.topk(logits, k_max, dim=-1).values
        threshold = top.gather(1, to_device(ks - 1, torch.int64, logits.device)[:, None])
        return logits.masked_fill(logits < threshold, float("-inf"))

    @staticmethod
    def _top_p(logits: torch.Tensor, top_p: np.ndarray) -> torch.Tensor:
        if top_p.min() >= 1.0:
            return logits
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs          # mass strictly above each token
        drop = before >= to_device(top_p, torch.float32, logits.device)[:, None]  # keeps the top
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)

    def _noise(self, probs: torch.Tensor, cols: SamplingColumns) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i in np.nonzero(cols.seeded & ~cols.greedy)[0].tolist():
            rid = cols.request_ids[i]
            gen = self.generators.get(rid)
            if gen is None:
                gen = torch.Generator(device=probs.device).manual_seed(int(cols.seed[i]))
                self.generators[rid] = gen
            noise[i].exponential_(generator=gen)
        return noise.clamp_min_(1e-10)

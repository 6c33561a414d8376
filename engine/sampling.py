"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

One host sync per step (the final token list), never one per request. Random rows draw
from an exponential race (argmax of p / E, E ~ Exp(1)), which samples exactly from p;
a seeded request draws its noise from its own generator, so its output does not depend
on what else is in the batch.
"""
from __future__ import annotations

import torch

from engine.device_io import to_device
from engine.request import Request


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """logits [S, V] (model dtype), one row per request (same order) -> token ids."""
        return self.sample_async(logits, requests).tolist()

    def sample_async(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Like sample, but returns the tokens as a device tensor (no host sync)."""
        if all(r.params.greedy for r in requests):
            return logits.argmax(dim=-1)   # exact on bf16: no upcast needed
        logits = logits.float()
        greedy_tokens = logits.argmax(dim=-1)
        temps = to_device([r.params.temperature or 1.0 for r in requests], torch.float32,
                          logits.device)
        scaled = logits / temps[:, None]
        scaled = self._top_k(scaled, requests)
        scaled = self._top_p(scaled, requests)
        probs = torch.softmax(scaled, dim=-1)
        noise = self._noise(probs, requests)
        random_tokens = (probs / noise).argmax(dim=-1)
        is_greedy = to_device([r.params.greedy for r in requests], torch.bool, logits.device)
        return torch.where(is_greedy, greedy_tokens, random_tokens)

    def _top_k(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        ks = [r.params.top_k if r.params.top_k > 0 else logits.shape[-1] for r in requests]
        if min(ks) >= logits.shape[-1]:
            return logits
        k_max = min(max(ks), logits.shape[-1])
        top = torch.topk(logits, k_max, dim=-1).values
        k_idx = to_device([min(k, k_max) - 1 for k in ks], torch.int64, logits.device)
        threshold = top.gather(1, k_idx[:, None])
        return logits.masked_fill(logits < threshold, float("-inf"))

    def _top_p(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        ps = [r.params.top_p for r in requests]
        if min(ps) >= 1.0:
            return logits
        top_p = to_device(ps, torch.float32, logits.device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs          # mass strictly above each token
        drop = before >= top_p[:, None]                 # always keeps the top token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)

    def _noise(self, probs: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, r in enumerate(requests):
            if r.params.seed is not None and not r.params.greedy:
                if r.generator is None:
                    r.generator = torch.Generator(device=probs.device).manual_seed(r.params.seed)
                noise[i].exponential_(generator=r.generator)
        return noise.clamp_min_(1e-10)

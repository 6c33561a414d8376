"""The sampling definitions as plain torch, one token at a time: the reference the
batched sampler (engine/worker/sampling.py) is checked against."""
from __future__ import annotations

from collections import Counter

import torch

from engine.request import Request

NEG_INF = float("-inf")


def ref_processed(logits: torch.Tensor, r: Request) -> torch.Tensor:
    """The definitions (vLLM / OpenAI / HF), one token at a time."""
    p, x = r.params, logits.clone().float()
    if p.min_tokens > len(r.output_token_ids):
        for t in r.stop_ids:
            x[t] = NEG_INF
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for t in set(r.prompt_token_ids) | set(r.output_token_ids):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t, c in Counter(r.output_token_ids).items():
        x[t] -= p.frequency_penalty * c + p.presence_penalty
    if p.greedy:
        return x
    x = x / p.temperature
    probs = x.softmax(-1)
    x[probs < p.min_p * probs.max()] = NEG_INF
    if p.top_k > 0:
        x[x < x.topk(p.top_k).values[-1]] = NEG_INF
    return x

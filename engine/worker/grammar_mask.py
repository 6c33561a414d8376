"""Structured outputs on the device: a step's grammar bitmask applied to its logits.

The core fills one packed bitmask per step for the rows a grammar constrains
(engine/core/structured/); here it goes to the device in one copy (the host buffer is
pinned on CUDA, so the copy does not wait for the stream) and the rows' disallowed
tokens become -inf in a float32 copy of the logits (kernels/token_bitmask.py): the
sampler, the rejection sampler of speculative decoding and the logprobs all read that
copy, while the model's own logits stay for the raw view (docs/STRUCTURED_OUTPUTS.md).
"""
from __future__ import annotations

import torch

from engine.worker.step_batch import GrammarMask
from kernels.token_bitmask import apply_token_bitmask


def _to_device(array, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(array)
    return host if device.type != "cuda" else host.to(device, non_blocking=True)


def masked_logits(logits: torch.Tensor, grammar: GrammarMask) -> torch.Tensor:
    """A float32 copy of logits [R, V] with every constrained row's disallowed tokens at
    -inf (the graphs' output buffer is never written)."""
    x = logits.to(torch.float32, copy=True)
    dev = logits.device
    apply_token_bitmask(x, _to_device(grammar.bitmask, dev), _to_device(grammar.rows, dev))
    return x

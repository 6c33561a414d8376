"""The Executor: what the engine core runs the model through (vLLM's Executor).

`build_executor(config)` loads the model and returns a `UniprocExecutor` (TP=1) or a
`TPExecutor` (TP>1: ranks 1..N-1 in worker processes). Both answer the same calls:
execute_model / sample_deferred / take_logprobs / prompt_logprobs (a step), release,
transfer_kv / kv_copy_seconds / host_kv (the KV tiers), the model's facts (name,
tokenizer, eos ids, vocab, max_model_len, num_blocks, backend, device), the draft
model's runner (`draft`) and close. `Executor` names that interface (the base class).
"""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.worker.executor.setup import setup_worker
from engine.worker.executor.tp import TPExecutor
from engine.worker.executor.uniproc import UniprocExecutor
from engine.worker.placement import resolve_device, resolve_dtype

Executor = UniprocExecutor      # the interface; TPExecutor extends it


def build_executor(config: EngineConfig) -> Executor:
    """Load the model on the configured device (TP: start ranks 1..N-1 first) and wrap
    it; a failure stops what it started."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    torch.manual_seed(config.seed)
    setup = setup_worker(config, device, dtype)
    if setup.tp_group is None:
        return UniprocExecutor(setup, device, dtype)
    return TPExecutor(setup, device, dtype)

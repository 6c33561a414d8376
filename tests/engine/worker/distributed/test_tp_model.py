"""Tensor parallel at the model level (CPU, gloo, 2 processes, float32): rank 0 in this
process, rank 1 a TPWorkerGroup worker, both reading their slices of a sharded-index HF
checkpoint. Over the paged path (a prompt of many blocks in two prefill chunks, a mixed
step, decodes), TP=2 logits and greedy tokens equal TP=1's (GPT-2 too: its Conv1D
weights are read transposed, slice by slice)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.worker.distributed.worker import TPWorkerGroup, WorkerSpec
from engine.worker.models.loader import load_model
from kernels import get_ops
from tests.hf_models import CONFIGS, make_checkpoint
from engine.worker.runner import ModelRunner
from tests.engine.worker.distributed.tp_helpers import BLOCK_SIZE, NUM_BLOCKS, RUNNER_KW, PagedDriver, shard_checkpoint

pytestmark = pytest.mark.slow       # the long tier: `pytest --run-slow` (README)

CPU, F32 = torch.device("cpu"), torch.float32
# one KV head: at TP=2 both ranks hold it (replicated, as vLLM does for N > kv heads)
LLAMA_KV1 = dict(CONFIGS["llama"], num_key_value_heads=1, num_attention_heads=4)


def _prompts(vocab: int):
    rng = np.random.default_rng(3)
    return [rng.integers(0, vocab, 37).tolist(), rng.integers(0, vocab, 13).tolist()]


def _runner(model) -> ModelRunner:
    return ModelRunner(model, get_ops("torch"), CPU, F32, NUM_BLOCKS, BLOCK_SIZE, **RUNNER_KW)


def _tp1(name: str, prompts):
    runner = _runner(load_model(name, CPU, F32).model)
    return PagedDriver(prompts).run(runner.execute)


def _tp2(name: str, prompts, transport: str = "shm"):
    group = TPWorkerGroup(WorkerSpec(name, 2, transport=transport))
    try:
        tp = group.start()
        runner_model = load_model(name, CPU, F32, tp=tp).model
        group.wait_ready()
        group.allocate_kv(NUM_BLOCKS, BLOCK_SIZE, **RUNNER_KW)
        runner = _runner(runner_model)   # rank 0 returns logits; rank 1 samples its own

        result = PagedDriver(prompts).run(lambda step: group.run(step, runner.execute))
    finally:
        group.shutdown()
    assert [p.exitcode for p in group.procs] == [0]
    return result


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "llama-kv1", "gpt2"])
def test_tp2_equals_tp1_on_sharded_checkpoint(kind, tmp_path):
    make_checkpoint(LLAMA_KV1 if kind == "llama-kv1" else kind, tmp_path)
    shard_checkpoint(tmp_path)
    prompts = _prompts(CONFIGS["llama"]["vocab_size"])
    logits1, tokens1 = _tp1(str(tmp_path), prompts)
    logits2, tokens2 = _tp2(str(tmp_path), prompts)
    assert tokens2 == tokens1
    assert len(tokens1[0]) > len(prompts[0]) + 4           # decodes happened
    for a, b in zip(logits1, logits2):
        assert a.shape == b.shape == (a.shape[0], CONFIGS["llama"]["vocab_size"])
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("transport", ["shm", "torch"])
def test_tp2_dummy_weights_equal_tp1(transport):
    """Each rank draws the TP=1 dummy tensors and keeps its slice: same greedy tokens
    (through either step transport)."""
    prompts = _prompts(512)
    logits1, tokens1 = _tp1("dummy:tiny", prompts)
    logits2, tokens2 = _tp2("dummy:tiny", prompts, transport)
    assert tokens2 == tokens1
    torch.testing.assert_close(logits2[-1], logits1[-1], atol=1e-5, rtol=1e-4)

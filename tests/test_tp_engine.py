"""Tensor parallelism end to end: TP=2 (gloo, 2 processes, float32) through LLM.generate
gives the same greedy tokens as TP=1, over a sharded checkpoint, with prompts longer
than several blocks, prefix-cache hits and preemptions; a killed rank ends the engine."""
import os
import signal
import time

import numpy as np
import pytest

from engine import LLM, EngineLoop, SamplingParams
from tests.hf_models import make_checkpoint
from tests.tp_helpers import shard_checkpoint

PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")     # "cuda": the same on 2 GPUs (NCCL)
KNOBS = dict(device=DEVICE, dtype="float32", num_blocks=40, block_size=4, max_num_seqs=6)


def workload():
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 320, 40).tolist()       # 10 blocks of a shared prefix
    return [shared + rng.integers(0, 320, n).tolist() for n in (5, 9, 30, 3, 17, 50)] + [shared]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tp2_greedy_equals_tp1(tmp_path, kind):
    make_checkpoint(kind, tmp_path)
    shard_checkpoint(tmp_path)
    prompts = [{"prompt_token_ids": p} for p in workload()]
    ref = LLM(model=str(tmp_path), **KNOBS).generate(prompts, PARAMS)
    llm = LLM(model=str(tmp_path), tensor_parallel_size=2, **KNOBS)
    try:
        got = llm.generate(prompts, PARAMS)
        c = llm.engine.counters
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
        assert c.preemptions > 0 and c.prefix_hits > 0      # both paths ran under TP
    finally:
        llm.engine.close()
    assert all(not p.is_alive() for p in llm.engine.tp_group.procs)


def test_killed_rank_ends_every_stream_with_an_error(tmp_path):
    make_checkpoint("llama", tmp_path)
    with EngineLoop(model=str(tmp_path), tensor_parallel_size=2, **{**KNOBS, "num_blocks": 256}) as loop:
        sp = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        s = loop.submit({"prompt_token_ids": list(range(1, 30))}, sp)
        s.get(timeout=60)
        os.kill(loop.engine.tp_group.procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        out = s.result(timeout=10)
        assert out.outputs[0].finish_reason == "error" and "rank 1" in out.error
        assert time.monotonic() - t0 < 10

"""Tensor parallelism end to end: TP=2 (gloo, 2 processes, float32) through LLM.generate
gives the same tokens as TP=1, greedy and seeded sampling alike, with async scheduling
on (continuation steps take their inputs from each rank's own samples), over a sharded
checkpoint, with prompts longer than several blocks, prefix-cache hits, preemptions and
prefill chunks that sample nothing;
a cancelled stream leaves the others exact; a killed rank ends every stream with an error.

ROSEPLAY_TEST_DEVICE=cuda runs the same on 2 GPUs (NCCL, CUDA graphs), under a hard
timeout that prints every stack (this process's and the workers') instead of hanging."""
import os
import signal
import time

import numpy as np
import pytest

from engine import LLM, EngineLoop, SamplingParams
from devtools.tp_timeout import exit_with_stacks_after
from tests.hf_models import make_checkpoint
from tests.engine.worker.distributed.tp_helpers import shard_checkpoint

DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")     # "cuda": the same on 2 GPUs (NCCL)
KNOBS = dict(device=DEVICE, dtype="float32", num_blocks=40, block_size=4, max_num_seqs=6)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def hard_timeout():
    """On CUDA a mismatched collective hangs instead of failing: dump stacks and exit."""
    if DEVICE != "cuda":
        yield
        return
    cancel = exit_with_stacks_after(120)
    yield
    cancel()


def workload():
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 320, 40).tolist()       # 10 blocks of a shared prefix
    return [shared + rng.integers(0, 320, n).tolist() for n in (5, 9, 30, 3, 17, 50)] + [shared]


def params_mix(n: int) -> list[SamplingParams]:
    """Greedy and seeded sampling rows in the same steps."""
    sampled = [SamplingParams(max_tokens=24, temperature=0.9, top_k=50, top_p=0.9, seed=i,
                              ignore_eos=True) for i in range(n)]
    return [GREEDY if i % 2 else sampled[i] for i in range(n)]


def _tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("kind", [pytest.param("llama", marks=pytest.mark.slow),
                                  pytest.param("qwen2", marks=pytest.mark.slow), "qwen3"])
def test_tp2_equals_tp1_with_async_scheduling(tmp_path, kind, monkeypatch):
    make_checkpoint(kind, tmp_path)
    shard_checkpoint(tmp_path)
    prompts = [{"prompt_token_ids": p} for p in workload()]
    params = params_mix(len(prompts))
    ref = LLM(model=str(tmp_path), **KNOBS)
    want = _tokens(ref.generate(prompts, params))
    ref.engine.close()
    llm = LLM(model=str(tmp_path), tensor_parallel_size=2, **KNOBS)
    group = llm.engine.executor.group
    continuations = []
    broadcast = group.broadcast
    monkeypatch.setattr(group, "broadcast", lambda batch, released=(): (
        continuations.append(batch.prev_token_rows is not None), broadcast(batch, released)))
    try:
        assert llm.engine.async_scheduling
        assert _tokens(llm.generate(prompts, params)) == want
        c = llm.engine.counters
        assert c.preemptions > 0 and c.prefix_hits > 0      # both paths ran under TP
        assert sum(continuations) >= 10                     # steps fed from each rank's samples
    finally:
        llm.engine.close()
    assert all(not p.is_alive() for p in group.procs)
    assert [p.exitcode for p in group.procs] == [0]


@pytest.mark.slow
def test_cancel_and_reused_ids_under_tp_stay_exact(tmp_path):
    """A cancelled stream leaves the others exact; a seeded request id used again starts
    a fresh generator on every rank (the workers release the old one before the step)."""
    make_checkpoint("llama", tmp_path)
    prompts = workload()[:3]
    params = params_mix(3)
    knobs = {**KNOBS, "num_blocks": 256}
    want = _tokens(LLM(model=str(tmp_path), **knobs).generate(
        [{"prompt_token_ids": p} for p in prompts], params))
    with EngineLoop(model=str(tmp_path), tensor_parallel_size=2, **knobs) as loop:
        victim = loop.submit({"prompt_token_ids": prompts[0]},
                             SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
        victim.get(timeout=60)
        streams = [loop.submit({"prompt_token_ids": p}, sp) for p, sp in zip(prompts, params)]
        loop.cancel(victim.request_id)
        assert victim.result(timeout=60).outputs[0].finish_reason == "cancelled"
        got = [list(s.result(timeout=120).outputs[0].token_ids) for s in streams]
        assert got == want
        for _ in range(2):
            again = loop.submit({"prompt_token_ids": prompts[0]}, params[0], request_id="same")
            assert list(again.result(timeout=120).outputs[0].token_ids) == want[0]
        assert loop.fatal_error is None


@pytest.mark.slow
def test_tp2_host_tier_reloads_and_swaps_as_tp1(tmp_path):
    """The host tier under TP=2: each rank copies its shard of every block (the
    KVTransfer goes to the workers before the step), so reloaded prefixes and swapped-in
    requests give TP=1's tokens without a tier."""
    make_checkpoint("llama", tmp_path)
    prompts = [{"prompt_token_ids": p} for p in workload()]
    ref = LLM(model=str(tmp_path), **KNOBS)
    want = _tokens(ref.generate(prompts, GREEDY))
    kv = ref.engine.executor.runner.kv_cache
    ref.engine.close()
    gib = 64 * kv[:, :, :1].numel() * kv.element_size() / 2 ** 30
    knobs = dict(KNOBS, num_blocks=32, max_num_seqs=3, kv_offloading_size=gib,
                 preemption_mode="swap")
    llm = LLM(model=str(tmp_path), tensor_parallel_size=2, **knobs)
    try:
        got = _tokens(llm.generate(prompts, GREEDY))
        got += _tokens(llm.generate(prompts[:2], GREEDY))      # the history comes back
        c = llm.engine.counters
    finally:
        llm.engine.close()
    assert got == want + want[:2]
    assert c.swap_ins > 0 and c.kv_reload_blocks > c.swap_ins and c.kv_offload_dropped == 0


def test_tp2_prefill_chunks_that_sample_nothing_run_as_tp1():
    """A budget of 3 cuts each prompt into chunks that sample no row: the vocab all-gather
    of zero rows must give [0, V] logits (it raised on every rank, failing every request)."""
    prompts = [{"prompt_token_ids": list(range(1 + i, 12 + 2 * i))} for i in range(3)]
    params = params_mix(len(prompts))
    knobs = dict(model="dummy:tiny", device=DEVICE, dtype="float32", max_num_batched_tokens=3)
    with LLM(**knobs) as ref:
        want = _tokens(ref.generate(prompts, params))
    with LLM(tensor_parallel_size=2, **knobs) as llm:
        assert _tokens(llm.generate(prompts, params)) == want


# last in the file: on CUDA a killed rank leaves NCCL unable to destroy its process group
# ("left to process exit"), so no later test of this process could start one
@pytest.mark.slow
def test_killed_rank_ends_every_stream_with_an_error(tmp_path):
    make_checkpoint("llama", tmp_path)
    with EngineLoop(model=str(tmp_path), tensor_parallel_size=2, **{**KNOBS, "num_blocks": 256}) as loop:
        sp = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        streams = [loop.submit({"prompt_token_ids": list(range(1 + i, 30 + i))}, sp)
                   for i in range(3)]
        for s in streams:
            s.get(timeout=60)
        os.kill(loop.engine.executor.group.procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        for s in streams:
            out = s.result(timeout=10)
            assert out.outputs[0].finish_reason == "error" and "rank 1" in out.error
        assert time.monotonic() - t0 < 10

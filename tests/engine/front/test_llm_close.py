"""LLM.close() and `with LLM(...)`: the workers, the process group and the engine's
memory are released, so a second LLM (plain, or tensor-parallel on CPU/gloo) starts and
generates in the same process, with the same tokens as the first."""
import os
import weakref

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams

DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")
KNOBS = dict(model="default", device=DEVICE, dtype="float32", num_blocks=40, block_size=4,
             max_num_seqs=4)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo"]


def tokens(llm):
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def test_plain_llm_twice_and_as_a_context_manager():
    first = LLM(**KNOBS)
    want = tokens(first)
    gone = [weakref.ref(first.engine), weakref.ref(first.engine.executor.runner.kv_cache)]
    first.close()
    assert [ref() for ref in gone] == [None, None]   # the engine and its KV cache are freed
    first.close()                                   # idempotent
    assert first.engine is None
    with pytest.raises(RuntimeError, match="this LLM is closed"):
        first.generate(PROMPTS, GREEDY)
    with LLM(**KNOBS) as second:
        assert tokens(second) == want
    assert second.engine is None


def test_a_closed_llm_says_so_wherever_its_engines_ran():
    """With its engines in their own processes too: generate and
    reset_prefix_cache raise 'this LLM is closed' (reset_prefix_cache did nothing,
    generate said 'engine is stopped (closed)')."""
    llm = LLM(model="dummy:tiny", device="cpu", num_blocks=64, data_parallel_size=2)
    assert llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0].finish_reason == "length"
    llm.close()
    llm.close()
    for call in (lambda: llm.generate([[1, 2, 3]], GREEDY), llm.reset_prefix_cache):
        with pytest.raises(RuntimeError, match="^this LLM is closed$"):
            call()


@pytest.mark.slow
def test_tensor_parallel_llm_twice_in_one_process():
    with LLM(**KNOBS) as ref:
        want = tokens(ref)
    for _ in range(2):        # the second would fail: "process group initialized twice"
        with LLM(tensor_parallel_size=2, **KNOBS) as llm:
            procs = list(llm.engine.executor.group.procs)
            assert dist.is_initialized() and all(p.is_alive() for p in procs)
            assert tokens(llm) == want
        assert not dist.is_initialized()
        assert not any(p.is_alive() for p in procs)

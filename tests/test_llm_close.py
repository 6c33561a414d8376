"""LLM.close() and `with LLM(...)`: the workers, the process group and the engine's
memory are released, so a second LLM (plain, or tensor-parallel on CPU/gloo) starts and
generates in the same process, with the same tokens as the first."""
import os

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams
from tests.hf_models import make_checkpoint

DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")
KNOBS = dict(device=DEVICE, dtype="float32", num_blocks=40, block_size=4, max_num_seqs=4)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5, 17, 3, 99, 42]}, {"prompt_token_ids": [7, 7, 8]}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    make_checkpoint("llama", path)
    return str(path)


def tokens(llm):
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def test_plain_llm_twice_and_as_a_context_manager(ckpt):
    first = LLM(model=ckpt, **KNOBS)
    want = tokens(first)
    first.close()
    first.close()                                   # idempotent
    assert first.engine is None
    with pytest.raises(RuntimeError, match="this LLM is closed"):
        first.generate(PROMPTS, GREEDY)
    with LLM(model=ckpt, **KNOBS) as second:
        assert tokens(second) == want
    assert second.engine is None


def test_tensor_parallel_llm_twice_in_one_process(ckpt):
    with LLM(model=ckpt, **KNOBS) as ref:
        want = tokens(ref)
    for _ in range(2):        # the second would fail: "process group initialized twice"
        with LLM(model=ckpt, tensor_parallel_size=2, **KNOBS) as llm:
            procs = list(llm.engine.tp_group.procs)
            assert dist.is_initialized() and all(p.is_alive() for p in procs)
            assert tokens(llm) == want
        assert not dist.is_initialized()
        assert not any(p.is_alive() for p in procs)

"""kv_cache_dtype fp8 through the engine on the GPU (Triton, CUDA graphs, bfloat16 model):
twice the blocks in the same memory, graphs and eager steps giving the same tokens,
calculate_kv_scales (its first step eager, then graphs reading the calibrated scales),
and no kernel compiled while serving."""
import gc

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.worker.test_engine_gpu import _compiled_variants, _greedy, _workload

pytestmark = pytest.mark.gpu
QWEN = dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="bfloat16",
            max_num_batched_tokens=2048)


def _release():
    """Free what earlier engines (this file's or another's in the same process) left for
    the collector: the pool is sized from the memory free at start-up."""
    gc.collect()
    torch.cuda.empty_cache()


def _blocks_and_bytes(**kw):
    _release()
    llm = LLM(**QWEN, **kw)
    try:      # no reference to the cache may outlive close: it would keep its memory
        cache = llm.engine.executor.runner.kv_cache
        nbytes = cache.numel() * cache.element_size()
        del cache
        return llm.engine.pool.num_blocks, nbytes
    finally:
        llm.engine.close()
        del llm                 # the next engine sizes its pool from the memory free then
        _release()


def test_fp8_pool_holds_twice_the_blocks():
    auto, fp8 = _blocks_and_bytes(), _blocks_and_bytes(kv_cache_dtype="fp8")
    assert 1.9 < fp8[0] / auto[0] < 2.1, (auto, fp8)
    assert 0.95 < fp8[1] / auto[1] < 1.05, (auto, fp8)


@pytest.mark.parametrize("calculate", [False, True])
def test_fp8_graphs_match_eager(calculate):
    prompts = _workload(151936)
    kw = dict(QWEN, num_blocks=4096, kv_cache_dtype="fp8", calculate_kv_scales=calculate)
    eager = LLM(enforce_eager=True, **kw)
    want = _greedy(eager, prompts)
    scales = eager.engine.executor.runner.kv_scales.clone()
    eager.engine.close()
    graphs = LLM(enforce_eager=False, **kw)
    try:
        assert graphs.engine.executor.runner.graphs.graphs
        assert _greedy(graphs, prompts) == want
        # the same first step, so the same scales (ones without calculate_kv_scales)
        assert torch.equal(graphs.engine.executor.runner.kv_scales, scales)
        assert calculate == bool((scales != 1).any())
    finally:
        graphs.engine.close()


def test_fp8_serving_compiles_no_new_kernel_variants():
    """As test_engine_gpu's: start-up compiles what fp8 steps need, the calibration
    step's unfused rotary and store included."""
    llm = LLM(model="dummy:tiny", device="cuda", dtype="float16", block_size=32,
              num_blocks=1024, max_num_batched_tokens=256, max_num_seqs=64,
              max_model_len=2048, kv_cache_dtype="fp8", calculate_kv_scales=True)
    try:
        before = _compiled_variants()
        outs = llm.generate(_workload(500, n=12),
                            SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
        assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
        assert _compiled_variants() == before
    finally:
        llm.engine.close()

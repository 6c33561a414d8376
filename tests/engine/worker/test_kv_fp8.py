"""kv_cache_dtype fp8 through the engine on the CPU (torch_sdpa backend, float32 model):
the pool (same bytes, more blocks), the backend choice, and the fp8 engine's greedy
tokens independent of the prefix cache, chunked prefill, preemption, copy-on-write,
speculative decoding and tensor parallelism (gloo), as the float engine's are; the scales
calculate_kv_scales sets on the first step. Accuracy against auto: test_kv_fp8_accuracy.py."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import DEFAULT_CPU_BLOCKS, InvalidRequestError, make_config
from engine.worker.placement import kv_bytes_per_block
from kernels.kv_quant import CALIBRATION_TARGET, FP8_DTYPE
from tests.engine.core.test_scheduler import mixed_workload
from tests.hf_models import make_checkpoint

BS, NEW = 16, 12
GREEDY = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)


def run(path, prompts, params=GREEDY, **kw):
    """(the engine's counters, tokens) of a greedy fp8 run of token-id prompts."""
    args = dict(model=str(path), device="cpu", dtype="float32", block_size=BS,
                num_blocks=256, check_invariants=True, kv_cache_dtype="fp8")
    args.update(kw)
    llm = LLM(**args)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return llm.engine.stats.counters, [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.engine.close()


@pytest.fixture(scope="module")
def reference(ckpt):
    """The fp8 engine's tokens with no prefix cache, no chunking, no pressure."""
    prompts = mixed_workload()
    return prompts, run(ckpt, prompts, enable_prefix_caching=False,
                        max_num_batched_tokens=4096)[1]


def test_pool_holds_more_blocks_in_the_same_bytes():
    """CPU default pool: the bytes of DEFAULT_CPU_BLOCKS float32 blocks, so fp8 (a
    quarter of float32, half of bfloat16 per element) holds four times the blocks (auto
    on torch_sdpa too: the pool does not depend on the backend; fp8's auto picks it)."""
    pools = {}
    for kv, backend in (("auto", "torch_sdpa"), ("fp8", "auto")):
        llm = LLM(model="dummy:tiny", device="cpu", kv_cache_dtype=kv, attention_backend=backend)
        try:
            cache = llm.engine.executor.runner.kv_cache
            pools[kv] = (llm.engine.pool.num_blocks, cache.numel() * cache.element_size(),
                         cache.dtype, llm.engine.backend)
        finally:
            llm.engine.close()
    assert pools["auto"][0] == DEFAULT_CPU_BLOCKS and pools["fp8"][0] == 4 * DEFAULT_CPU_BLOCKS
    assert pools["auto"][1] == pools["fp8"][1]
    assert pools["fp8"][2] == FP8_DTYPE and pools["fp8"][3] == "torch_sdpa"
    model = llm.engine.executor.runner.model
    assert kv_bytes_per_block(model, BS, torch.bfloat16) == \
        2 * kv_bytes_per_block(model, BS, FP8_DTYPE)


def test_cpu_native_is_refused_with_fp8_and_scales_are_ignored_with_auto():
    with pytest.raises(InvalidRequestError, match="cpu_native"):
        make_config(kv_cache_dtype="fp8", attention_backend="cpu_native")
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
        make_config(kv_cache_dtype="fp16")
    assert make_config(calculate_kv_scales=True).kv_cache_dtype == "auto"   # as vLLM


@pytest.mark.parametrize("knobs", [
    dict(max_num_batched_tokens=64),                        # chunked prefill, prefix cache
    dict(max_num_batched_tokens=32, num_blocks=14),         # + preemption, eviction
    dict(max_num_batched_tokens=64, scheduling_mode="prefill-first"),
])
def test_tokens_do_not_depend_on_knobs(ckpt, reference, knobs):
    prompts, ref = reference
    counters, got = run(ckpt, prompts, **knobs)
    assert got == ref
    assert counters.prefix_hits > 0 or counters.dedup_joined > 0
    if knobs.get("num_blocks") == 14:
        assert counters.preemptions > 0


def test_copy_on_write_copies_fp8_blocks(ckpt):
    """Identical prompts prefill once; the shared, partly filled last block is copied
    (as bytes: the CPU has no fp8 index_copy_) before each follower writes into it."""
    prompt = list(range(1, 41))
    counters, got = run(ckpt, [prompt] * 3, max_num_batched_tokens=1024)
    assert counters.cow_copies == 2 and counters.dedup_joined == 2
    assert got[0] == got[1] == got[2]
    assert got[0] == run(ckpt, [prompt])[1][0]


def test_speculative_decoding_keeps_fp8_tokens(ckpt, reference):
    """n-gram drafts verified against an fp8 cache: the greedy tokens of no speculation
    (verify rows store every position before any attends)."""
    prompts, ref = reference
    counters, got = run(ckpt, prompts, enable_prefix_caching=False,
                        max_num_batched_tokens=4096,
                        speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert got == ref
    assert counters.spec_decode_num_drafts > 0


def test_calculate_kv_scales_sets_per_head_scales_on_the_first_step(ckpt):
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=64,
              kv_cache_dtype="fp8", calculate_kv_scales=True)
    try:
        runner = llm.engine.executor.runner
        assert torch.equal(runner.kv_scales, torch.ones_like(runner.kv_scales))
        # every layer's scales start 16-byte aligned, as layer 0's do: the kernels warmed
        # on layer 0 at start-up are the ones every layer launches (no compile serving)
        layers = runner.model.attention_layers()
        assert len(layers) > 1 and runner.kv_scales.shape[2] % 4
        for layer in layers:
            assert all(t.data_ptr() % 16 == 0 for t in layer.kv_scales.values())
        prompt = list(range(3, 40))
        one = SamplingParams(max_tokens=1, temperature=0)     # one step: the prefill only
        first = llm.generate([{"prompt_token_ids": prompt}], one)[0].outputs[0].token_ids
        scales = runner.kv_scales.clone()
        assert not runner.scales_pending
        assert (scales != 1).all() and (scales > 0).all()
        assert len({round(float(s), 6) for s in scales[0].flatten()}) > 1   # per head
        # each layer's and head's largest stored code is the calibration target
        codes = runner.kv_cache.float().abs().amax(dim=(2, 3, 5))        # [2, layers, heads]
        assert torch.equal(codes, torch.full_like(codes, CALIBRATION_TARGET))
        again = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0].outputs[0].token_ids
        assert torch.equal(runner.kv_scales, scales)              # fixed after the first
        assert list(again[:1]) == list(first)
    finally:
        llm.engine.close()


@pytest.mark.slow       # a tensor-parallel worker group: the long tier (README)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("calculate", [False, True])
def test_tensor_parallel_fp8_equals_one_rank(tmp_path, calculate):
    """TP=2 on gloo: each rank holds its KV heads' blocks and scales (calculated from
    its own heads: no collective); the tokens are TP=1's."""
    make_checkpoint("llama", tmp_path)
    prompts = mixed_workload()[:6]
    kw = dict(max_num_batched_tokens=4096, calculate_kv_scales=calculate)
    one = run(tmp_path, prompts, **kw)[1]
    two = run(tmp_path, prompts, tensor_parallel_size=2, **kw)[1]
    assert one == two


def test_calibration_warm_up_stores_nothing(ckpt):
    """The GPU start-up runs calculate_kv_scales' unfused kernels once (no compile in
    the first step); they store nothing and leave the scales pending."""
    from engine.worker.warmup import _warm_up_calibration
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=16,
              kv_cache_dtype="fp8", calculate_kv_scales=True)
    try:
        runner = llm.engine.executor.runner
        runner.kv_cache.view(torch.uint8).fill_(7)
        _warm_up_calibration(runner, runner.model.attention_layers()[0])
        assert bool((runner.kv_cache.view(torch.uint8) == 7).all())
        assert runner.scales_pending
    finally:
        llm.engine.close()

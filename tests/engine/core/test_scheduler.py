"""Scheduler behaviour: outputs independent of knobs, invariants, counted sharing."""
import threading
from unittest import mock

import pytest
import torch

from engine import LLM, EngineLoop, SamplingParams
from engine.worker.runner import ModelRunner
from tests.hf_models import make_checkpoint

NEW = 12
BS = 16


def mixed_workload(vocab=320):
    g = torch.Generator().manual_seed(7)
    rand = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    system = rand(3 * BS + 5)            # shared system prompt: 3 full blocks + 5
    identical = rand(40)
    prompts = [system + rand(n) for n in (3, 9, 20)]
    prompts += [identical] * 3
    prompts += [rand(150), rand(2), rand(33), rand(70)]
    prompts += [system + rand(1)]
    return prompts


def run(path, prompts, on_step=None, priority=None, **kw):
    args = dict(device="cpu", dtype="float32", block_size=BS, num_blocks=256,
                check_invariants=True)
    args.update(kw)
    llm = LLM(model=str(path), **args)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True),
                        on_step=on_step, priority=priority)
    return llm, [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def reference(ckpt):
    path = ckpt
    prompts = mixed_workload()
    _, ref = run(path, prompts, enable_prefix_caching=False, max_num_batched_tokens=4096,
                 max_num_seqs=1)
    return prompts, ref


def test_reference_matches_hf(ckpt, reference):
    hf = ckpt.hf
    prompts, ref = reference
    for p, tokens in zip(prompts, ref):
        ids = torch.tensor([p])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                          min_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out[0, len(p):].tolist() == tokens


@pytest.mark.parametrize("knobs", [
    dict(enable_prefix_caching=True),
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=8),
    dict(max_num_batched_tokens=32),
    dict(max_num_batched_tokens=1024),
    dict(max_num_seqs=1),
    dict(max_num_seqs=4),
    dict(max_num_seqs=64),
], ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_outputs_do_not_depend_on_knobs(ckpt, reference, knobs):
    prompts, ref = reference
    llm, got = run(ckpt, prompts, **knobs)
    assert got == ref
    llm.engine.clear_prefix_cache()
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


def test_outputs_survive_preemption(ckpt, reference):
    prompts, ref = reference
    # 14 blocks of 16 tokens cannot hold all running requests: preemption must happen
    llm, got = run(ckpt, prompts, num_blocks=14, max_num_batched_tokens=64)
    assert llm.engine.stats.counters.preemptions > 0
    assert got == ref
    llm.engine.clear_prefix_cache()
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


POLICIES = [dict(scheduling_mode="prefill-first"), dict(scheduling_mode="mixed-chunk"),
            dict(scheduling_policy="priority"), dict(scheduling_policy="lpm"),
            dict(eviction_policy="lfu"),
            dict(scheduling_mode="prefill-first", scheduling_policy="lpm", eviction_policy="lfu")]


@pytest.mark.parametrize("knobs", POLICIES, ids=lambda k: ",".join(k.values()))
def test_policies_keep_greedy_outputs_under_preemption(ckpt, reference, knobs):
    """Every policy, with a pool too small for the workload (preemptions and evictions);
    prefill-first never runs a step with both prefill and decode tokens."""
    prompts, ref = reference
    mixed = []

    def on_step(engine):
        s = engine.stats.last_step
        mixed.append(s is not None and s.decode_tokens > 0 and s.prefill_tokens > 0)

    priority = [(7 * i) % 5 - 2 for i in range(len(prompts))]
    llm, got = run(ckpt, prompts, on_step=on_step, priority=priority, num_blocks=14,
                   max_num_batched_tokens=64, **knobs)
    assert got == ref
    c = llm.engine.stats.counters
    assert c.preemptions > 0 and c.evictions > 0
    if knobs.get("scheduling_mode") == "prefill-first":
        assert not any(mixed)
    else:
        assert any(mixed)
    assert llm.engine.snapshot().kv_block_metrics.lifetime.count == c.evictions


def test_identical_prompts_prefill_once(ckpt):
    prompt = list(range(1, 41))
    llm, got = run(ckpt, [prompt] * 3, max_num_batched_tokens=1024)
    c = llm.engine.stats.counters
    assert c.prefill_tokens == 40
    assert c.dedup_joined == 2
    assert got[0] == got[1] == got[2]
    # 40 tokens = 2 full blocks + 8: the partly filled last block is shared, then copied
    assert c.cow_copies == 2


def test_cow_copies_of_one_step_are_one_call(ckpt):
    prompt = list(range(1, 41))
    calls = []
    real = ModelRunner.copy_blocks

    def spy(self, src, dst):
        if len(src):
            calls.append(list(zip(src.tolist(), dst.tolist())))
        return real(self, src, dst)

    with mock.patch.object(ModelRunner, "copy_blocks", spy):
        llm, _ = run(ckpt, [prompt] * 4, max_num_batched_tokens=1024)
    assert len(calls) == 1 and len(calls[0]) == 3


def test_shared_system_prompt_prefills_only_suffix(ckpt):
    system = list(range(100, 100 + 3 * BS))
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=64,
              check_invariants=True)
    sp = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": system + [1, 2, 3]}], sp)
    before = llm.engine.stats.counters.prefill_tokens
    out = llm.generate([{"prompt_token_ids": system + [7, 8, 9, 10, 11]}], sp)
    assert llm.engine.stats.counters.prefill_tokens - before == 5
    assert out[0].metrics.num_cached_tokens == 3 * BS


def test_full_prompt_hit_still_samples(ckpt):
    prompt = list(range(1, 1 + 2 * BS))       # exactly two full blocks
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=64,
              check_invariants=True)
    sp = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompt}], sp)[0]
    before = llm.engine.stats.counters.prefill_tokens
    again = llm.generate([{"prompt_token_ids": prompt}], sp)[0]
    # the last block is recomputed (at least the last token must be) -> 16 tokens, 1 block hit
    assert llm.engine.stats.counters.prefill_tokens - before == BS
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_long_prompt_chunked_while_decodes_continue(ckpt):
    # synchronous steps: each step()'s tokens are its own (async scheduling returns them
    # one call later; the step composition is the same)
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=128,
              max_num_batched_tokens=64, max_model_len=2048, check_invariants=True,
              async_scheduling=False)
    eng = llm.engine
    short = llm.add_request({"prompt_token_ids": [5, 6, 7]},
                            SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    eng.step()                                # short prefilled, now decoding
    long = llm.add_request({"prompt_token_ids": [i % 300 for i in range(1000)]},
                           SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    prefill_steps = 0
    while not long.output_token_ids:
        n_out = len(short.output_token_ids)
        eng.step()
        prefill_steps += 1
        assert len(short.output_token_ids) == n_out + 1, "decode must run every step"
        assert eng.stats.last_step.decode_tokens == 1
        assert eng.stats.last_step.prefill_tokens <= 63
    # budget 64 = 1 decode + 63 prefill per step -> ceil(1000 / 63) = 16 steps
    assert prefill_steps == 16


def test_oversized_prompt_makes_progress_alone(ckpt):
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", block_size=BS, num_blocks=128,
              max_num_batched_tokens=8, check_invariants=True)
    out = llm.generate([{"prompt_token_ids": list(range(1, 200))}],
                       SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.engine.stats.counters.steps == 25 + 2


def test_knob_change_from_other_thread_applies_next_step(ckpt):
    loop = EngineLoop(model=str(ckpt), device="cpu", dtype="float32", block_size=BS,
                      num_blocks=128, max_num_batched_tokens=16)
    try:
        loop.pause()
        stream = loop.submit({"prompt_token_ids": list(range(1, 201))},
                             SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        assert loop.step_once().wait(10)
        assert loop.engine.stats.last_step.prefill_tokens == 16
        t = threading.Thread(target=lambda: loop.set_knobs(max_num_batched_tokens=48,
                                                           enable_prefix_caching=False))
        t.start(); t.join()
        assert loop.step_once().wait(10)
        assert loop.engine.stats.last_step.prefill_tokens == 48
        assert loop.engine.knobs.enable_prefix_caching is False
        loop.resume()
        assert stream.result(timeout=30).outputs[0].finish_reason == "length"
    finally:
        loop.close()


def test_all_blocks_free_after_cache_clear(ckpt, reference):
    prompts, _ = reference
    llm, _ = run(ckpt, prompts, num_blocks=40)
    pool = llm.engine.pool
    assert pool.num_cached > 0
    llm.engine.clear_prefix_cache()
    assert pool.num_free == pool.num_blocks and pool.num_cached == 0
    assert (pool.refcounts == 0).all()

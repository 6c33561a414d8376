"""Penalties, bias, min_tokens and logprobs through the scheduler's hard cases: a pool
too small for the batch (preemption and recompute), chunked prefill, prefix-cache hits
and dedup of identical prompts, async scheduling: tokens and logprobs equal a run with
room for everything (the token counts on the device survive all of it)."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

SYSTEM = "ROMEO.\nWhat news from the court? " * 4
PROMPTS = [SYSTEM + tail for tail in ("Speak!", "Say on.", "O, tell me.", "Well?")] + \
          ["JULIET.\nAy me!"] * 3 + ["First Citizen:\nBefore we proceed any further, hear me."]
MAX_TOKENS = 16


def params(i: int) -> SamplingParams:
    kinds = [dict(temperature=0, frequency_penalty=1.0, presence_penalty=0.5, logprobs=2),
             dict(temperature=0, repetition_penalty=1.5, logit_bias={199: -3.0}),
             dict(temperature=0.9, seed=i, presence_penalty=0.8, min_p=0.05, logprobs=1),
             dict(temperature=0, min_tokens=8, frequency_penalty=0.5)]
    return SamplingParams(max_tokens=MAX_TOKENS, **kinds[i % 4])


def generate(**kw):
    llm = LLM(device="cpu", block_size=16, check_invariants=True, **kw)
    outs = llm.generate(PROMPTS, [params(i) for i in range(len(PROMPTS))])
    return llm, [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def reference():
    return generate(num_blocks=256)[1]


def test_preemption_chunking_and_prefix_hits_keep_tokens_and_logprobs(reference):
    llm, got = generate(num_blocks=14, max_num_batched_tokens=32)
    counters = llm.engine.stats.counters
    assert counters.preemptions > 0 and counters.prefix_hit_tokens > 0
    assert counters.dedup_joined > 0      # (the 45-token prompts take 2 chunks of 32)
    for ref, out in zip(reference, got):
        assert out.token_ids == ref.token_ids
        if ref.logprobs is not None:
            assert [lp.logprobs for lp in out.logprobs] == \
                [pytest.approx(lp.logprobs, abs=1e-4) for lp in ref.logprobs]
    assert llm.engine.executor.runner.sampler.counts.slots == {}          # every slot released


def test_logprobs_mode_knob_reaches_the_sampler():
    """logprobs_mode=raw_logprobs: the same seeded draws (sampling does not change), the
    model's own log-softmax instead of the tempered one: same order, other values."""
    sp = SamplingParams(max_tokens=6, temperature=0.5, seed=3, logprobs=3)
    runs = {mode: LLM(device="cpu", logprobs_mode=mode).generate(PROMPTS[:1], sp)[0].outputs[0]
            for mode in ("processed_logprobs", "raw_logprobs")}
    raw, processed = runs["raw_logprobs"], runs["processed_logprobs"]
    assert raw.token_ids == processed.token_ids
    for r, p in zip(raw.logprobs, processed.logprobs):
        assert r.token_ids == p.token_ids and r.rank == p.rank
        assert r.logprobs[1] < p.logprobs[1]      # T < 1 sharpens: the top one gains


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prompt_logprobs_when_a_chunk_leaves_only_the_last_prompt_token(async_scheduling):
    """A budget that leaves one prompt token for the next step: that token runs as a
    prefill chunk and delivers the prompt logprobs (run as a decode, it never did, and
    the request came back without them); every length against every budget."""
    sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": list(range(7, 7 + n))} for n in range(1, 9)]
    want = LLM(model="dummy:tiny", device="cpu").generate(prompts, sp)
    for budget in (1, 2, 3):
        llm = LLM(model="dummy:tiny", device="cpu", max_num_batched_tokens=budget,
                  async_scheduling=async_scheduling, check_invariants=True)
        for prompt, ref in zip(prompts, want):
            got = llm.generate(prompt, sp)[0]
            assert got.outputs[0].token_ids == ref.outputs[0].token_ids
            assert got.prompt_logprobs is not None, (budget, len(ref.prompt_logprobs))
            assert [e and (e.token_ids, e.rank) for e in got.prompt_logprobs] == \
                [e and (e.token_ids, e.rank) for e in ref.prompt_logprobs]

"""Speculation's off-switch (speculative_config `disable_by_batch_size`, vLLM's name;
docs/SPECULATIVE.md "The off-switch"): while more requests decode than the threshold a
step proposes no drafts and runs as a plain decode step (no verify rows, chained by
async scheduling as with k = 0); when the batch drops, drafts come back. Greedy tokens
equal k = 0's; the snapshot says why drafts stopped and the counters tell steps with
and without drafts; the config refuses what vLLM refuses."""
import numpy as np
import pytest

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams
from engine.config import DEFAULT_DISABLE_BY_BATCH_SIZE, InvalidRequestError, make_config
from engine.core.spec_decode import SPEC_ASYNC_RUN

KW = dict(model="default", device="cpu", max_num_seqs=8, max_num_batched_tokens=256)
LONG, SHORT = 36, 10          # 4 requests end early: 8 decoding, then 4


def _prompts_and_params(vocab: int):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, vocab - 10, 20).tolist() for _ in range(8)]
    params = [SamplingParams(max_tokens=SHORT if i % 2 else LONG, temperature=0,
                             ignore_eos=True) for i in range(8)]
    return [{"prompt_token_ids": p} for p in prompts], params


def _watch(eng) -> list:
    """Every launched step: (decoding, verifies, spec_off, launched before the previous
    step's tokens were read)."""
    seen, launch = [], eng._launch

    def spy(plan, device_fed=False):
        seen.append((len(plan.decodes) + len(plan.verifies), len(plan.verifies),
                     plan.spec_off, device_fed))
        return launch(plan, device_fed)
    eng._launch = spy
    return seen


@pytest.fixture(scope="module")
def reference():
    with LLM(**KW) as llm:
        prompts, params = _prompts_and_params(llm.engine.vocab_size)
        outs = llm.generate(prompts, params)
    return prompts, params, [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_batch_above_the_threshold_drafts_nothing_and_drafts_again_below(
        reference, async_scheduling):
    prompts, params, want = reference
    oracle = OracleProposer(((p["prompt_token_ids"], w) for p, w in zip(prompts, want)), p=1.0)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4}
    pauses = []
    with LLM(speculative_config=spec, proposer=oracle, async_scheduling=async_scheduling,
             check_invariants=True, **KW) as llm:
        eng = llm.engine
        seen = _watch(eng)
        got = llm.generate(prompts, params, on_step=lambda e: pauses.append(
            e.snapshot().spec_pause))
        c = eng.counters
    assert [list(o.outputs[0].token_ids) for o in got] == want
    off = [s for s in seen if s[0] > 4]
    on = [s for s in seen if 0 < s[0] <= 4]
    assert off and on
    assert all(v == 0 and spec_off == n for n, v, spec_off, _ in off)
    assert all(spec_off == 0 for _, _, spec_off, _ in on)
    assert sum(v for _, v, _, _ in on) > 0                 # speculation resumed
    if async_scheduling:       # an off step chains as a plain decode step does (more in
        assert len(off) > SPEC_ASYNC_RUN and all(chained for *_, chained in off)  # a row)
    assert c.spec_decode_steps_off == len(off)
    assert c.spec_decode_steps_with_drafts == sum(1 for s in seen if s[1])
    assert c.spec_decode_steps_with_drafts + c.spec_decode_steps_without_drafts == \
        sum(1 for s in seen if s[0])
    # float32 on the CPU: the oracle's references are this engine's own tokens
    assert c.spec_decode_num_accepted_tokens == c.spec_decode_num_draft_tokens > 0
    assert "speculation off: 8 decoding > disable_by_batch_size 4" in pauses
    assert pauses[-1] == ""


def test_null_never_switches_speculation_off(reference):
    prompts, params, want = reference
    oracle = OracleProposer(((p["prompt_token_ids"], w) for p, w in zip(prompts, want)), p=1.0)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None}
    with LLM(speculative_config=spec, proposer=oracle, **KW) as llm:
        seen = _watch(llm.engine)
        got = llm.generate(prompts, params)
        assert llm.engine.snapshot().spec_disable_by_batch_size == 0
        assert llm.engine.counters.spec_decode_steps_off == 0
    assert [list(o.outputs[0].token_ids) for o in got] == want
    assert any(n == 8 and v > 0 for n, v, _, _ in seen)


def test_disable_by_batch_size_is_checked_where_the_config_is_parsed():
    cfg = make_config(num_speculative_tokens=3)
    assert cfg.speculative_config is None      # k alone: ngram's defaults, its threshold
    spec = make_config(speculative_config='{"num_speculative_tokens": 2}').speculative_config
    assert spec.disable_by_batch_size == DEFAULT_DISABLE_BY_BATCH_SIZE == 32
    never = make_config(speculative_config='{"disable_by_batch_size": null}')
    assert never.speculative_config.disable_by_batch_size is None
    assert make_config(speculative_config={"disable_by_batch_size": 2}) \
        .speculative_config.disable_by_batch_size == 2
    for bad in (0, 1, -4, True, 2.5, "8"):
        with pytest.raises(InvalidRequestError, match="disable_by_batch_size"):
            make_config(speculative_config={"disable_by_batch_size": bad})


def test_the_draft_model_catches_up_after_a_pause(reference):
    """The bundled draft sees no tokens while speculation is off (8 decoding > 4); once
    the batch drops it catches up on everything it missed (one extend) and drafts."""
    prompts, params, want = reference
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "disable_by_batch_size": 4}
    with LLM(speculative_config=spec, check_invariants=True, **KW) as llm:
        seen = _watch(llm.engine)
        got = llm.generate(prompts, params)
        c = llm.engine.counters
        assert c.spec_decode_steps_off > 0 and c.spec_decode_num_draft_tokens > 0
        assert not llm.engine.spec.draft.disabled
    assert [list(o.outputs[0].token_ids) for o in got] == want
    assert all(v == 0 for n, v, _, _ in seen if n > 4)

"""vLLM's output text fields of SamplingParams, applied by the front: detokenize,
skip_special_tokens and include_stop_str_in_output (each was refused as an unknown
keyword, so a vLLM script failed on them)."""
from __future__ import annotations

import pytest

from engine import LLM, EngineLoop, InvalidRequestError, SamplingParams

PROMPT = "ROMEO:"
GREEDY = dict(temperature=0.0, max_tokens=30)


@pytest.fixture(scope="module")
def llm():
    with LLM(model="default", device="cpu") as llm:
        yield llm


def test_skip_special_tokens_false_shows_them(llm):
    """The bundled model's EOS (id 0), forced by a bias and kept by ignore_eos: skipped
    from the text by default, shown with skip_special_tokens=False."""
    forced = dict(temperature=0.0, max_tokens=3, ignore_eos=True, logit_bias={0: 100.0})
    hidden, shown = (llm.generate(PROMPT, SamplingParams(**forced, skip_special_tokens=skip))[0]
                     .outputs[0] for skip in (True, False))
    assert hidden.token_ids == shown.token_ids == (0, 0, 0)
    assert hidden.text == "" and shown.text == llm.tokenizer.decode([0, 0, 0]) != ""


def test_include_stop_str_in_output_keeps_the_stop_string(llm):
    cut = llm.generate(PROMPT, SamplingParams(**GREEDY, stop=["King"]))[0].outputs[0]
    kept = llm.generate(PROMPT, SamplingParams(**GREEDY, stop=["King"],
                                               include_stop_str_in_output=True))[0].outputs[0]
    assert cut.stop_reason == kept.stop_reason == "King"
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert kept.text == cut.text + "King" and "King" not in cut.text
    with EngineLoop(model="default", device="cpu") as loop:       # a stream: the same text
        events = list(loop.submit(PROMPT, SamplingParams(**GREEDY, stop=["King"],
                                                         include_stop_str_in_output=True)))
    assert "".join(e.text for e in events) == kept.text == events[-1].output.outputs[0].text


def test_detokenize_false_leaves_the_text_empty(llm):
    plain = llm.generate(PROMPT, SamplingParams(**GREEDY))[0].outputs[0]
    ids_only = llm.generate(PROMPT, SamplingParams(**GREEDY, detokenize=False))[0].outputs[0]
    assert ids_only.token_ids == plain.token_ids and plain.text and ids_only.text == ""
    with pytest.raises(InvalidRequestError, match="stop strings need detokenize=True"):
        SamplingParams(detokenize=False, stop="x")
    for name in ("detokenize", "skip_special_tokens", "include_stop_str_in_output"):
        with pytest.raises(InvalidRequestError, match=f"{name} must be a boolean"):
            SamplingParams(**{name: 1})


def test_a_stop_token_text_is_left_out_unless_asked(llm):
    """vLLM's detokenizer leaves out the text of the token that stopped the output (a
    stop_token_ids id, EOS) unless include_stop_str_in_output; it was kept. The token
    id stays in token_ids, and a stream sends the same text."""
    free = llm.generate(PROMPT, SamplingParams(**GREEDY))[0].outputs[0]
    token = free.token_ids[2]
    end = free.token_ids.index(token) + 1
    stop = dict(**GREEDY, stop_token_ids=[token])
    cut = llm.generate(PROMPT, SamplingParams(**stop))[0].outputs[0]
    kept = llm.generate(PROMPT, SamplingParams(**stop, include_stop_str_in_output=True)
                        )[0].outputs[0]
    assert cut.token_ids == kept.token_ids == free.token_ids[:end] and cut.stop_reason == token
    assert kept.text == llm.tokenizer.decode(free.token_ids[:end])
    assert cut.text == llm.tokenizer.decode(free.token_ids[:end - 1]) != kept.text
    eos = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=3, logit_bias={0: 100.0},
                                              skip_special_tokens=False))[0].outputs[0]
    assert eos.token_ids == (0,) and eos.finish_reason == "stop" and eos.text == ""
    with EngineLoop(model="default", device="cpu") as loop:
        events = list(loop.submit(PROMPT, SamplingParams(**stop)))
    assert "".join(e.text for e in events) == cut.text


def test_logprobs_read_as_vllm_dicts(llm):
    """Each logprobs entry also reads as vLLM's dict[token id, Logprob] (a vLLM script's
    lp[token_id].logprob and lp.items() raised here): the sampled token with its rank,
    the top-n with theirs, the same values as the entry's lists."""
    out = llm.generate(PROMPT, SamplingParams(max_tokens=4, logprobs=3, seed=1,
                                              prompt_logprobs=2))[0]
    for token, lp in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert lp[token].logprob == lp.logprobs[0] and lp[token].rank == lp.rank
        assert token in lp and lp.get(-1) is None and lp and 3 <= len(lp) <= 4
        top = [(t, v) for t, v in zip(lp.token_ids[1:], lp.logprobs[1:])]
        assert [(t, x.logprob) for t, x in lp.items() if t != token] == \
            [(t, v) for t, v in top if t != token]
        assert sorted(x.rank for t, x in lp.items() if t != token) == \
            [i + 1 for i, (t, _) in enumerate(top) if t != token]
    first = out.prompt_logprobs[1]
    assert first[out.prompt_token_ids[1]].rank == first.rank

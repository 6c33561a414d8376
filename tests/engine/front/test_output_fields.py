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

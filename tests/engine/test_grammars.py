"""A constraint its grammar library cannot read is refused at submit, as vLLM's input
processor refuses it (engine/grammars.py check_grammar): LLM.generate raises an
InvalidRequestError (a ValueError) naming the field, with the backend the config selects;
nothing reaches the engine (its compile counter stays), and the engine serves the next
request. The library's reason reads as one line. An empty choice list is refused where the params are built."""
from __future__ import annotations

import msgspec
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.config import InvalidRequestError
from engine.grammars import check_grammar
from engine.structured_outputs import GRAMMAR_ERROR

pytestmark = pytest.mark.timeout(600)
PROMPT = "ROMEO.\nWho art thou?\n\nJULIET.\n"
INVALID = {       # kind -> a spec both libraries refuse, and the field the message names
    "regex": ({"regex": "("}, "structured_outputs.regex"),
    "json schema": ({"json": {"type": "no-such-type"}}, "structured_outputs.json"),
    "dangling $ref": ({"json": {"$ref": "#/$defs/missing"}}, "structured_outputs.json"),
    "lark grammar": ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar"),
    "ebnf grammar": ({"grammar": 'root ::= "a" undefined_rule'}, "structured_outputs.grammar"),
}


@pytest.fixture(scope="module", params=["auto", "xgrammar"])
def llm(request):
    return LLM(model="dummy:tiny", device="cpu", num_blocks=64,
               structured_outputs_config={"backend": request.param})


@pytest.mark.parametrize("kind", list(INVALID))
def test_an_invalid_constraint_raises_at_generate_and_the_engine_serves_on(llm, kind):
    spec, field = INVALID[kind]
    compiles = llm.engine.counters.grammar_compiles
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**spec))
    with pytest.raises(InvalidRequestError) as err:
        llm.generate([[1, 2, 3], [4, 5, 6]], [SamplingParams(max_tokens=4), bad])
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith(f"{GRAMMAR_ERROR}: {field} is invalid: "), str(err.value)
    assert "\n" not in str(err.value) and ".cc:" not in str(err.value)   # one line
    assert llm.engine.counters.grammar_compiles == compiles and not llm.engine.requests
    good = SamplingParams(max_tokens=3, temperature=0,
                          structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    out = llm.generate([[1, 2, 3]], good)[0]
    assert out.outputs[0].finish_reason == "stop" and out.error is None
    assert llm.engine.counters.grammar_compiles == compiles + (compiles == 0)


def test_the_schema_true_takes_any_json_value(llm):
    """JSON Schema's `true` (what `response_format` json_schema with schema true sends):
    llguidance refused it ('Expecting object schema to apply options')."""
    sp = SamplingParams(max_tokens=6, temperature=0, structured_outputs={"json": "true"})
    out = llm.generate([[1, 2, 3]], sp)[0]
    assert out.error is None and out.outputs[0].finish_reason in ("stop", "length")


def test_an_empty_choice_list_is_refused_where_the_params_are_built():
    with pytest.raises(InvalidRequestError, match="structured_outputs.choice must be"):
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=[]))
    with pytest.raises(InvalidRequestError, match="structured_outputs.choice must be"):
        SamplingParams(structured_outputs={"choice": []})


def test_a_check_is_kept_per_spec(monkeypatch):
    """The second check of a spec reads the first one's answer (no second parse)."""
    import engine.grammars as grammars
    calls = []
    refusal = grammars._refusal
    monkeypatch.setattr(grammars, "_refusal", lambda p, b: calls.append(p) or refusal(p, b))
    p = StructuredOutputsParams(regex="[0-9]{2}(x")
    for _ in range(2):
        with pytest.raises(InvalidRequestError):
            check_grammar(p, "guidance")
    check_grammar(StructuredOutputsParams(regex="[0-9]{3}"), "guidance")
    check_grammar(StructuredOutputsParams(regex="[0-9]{3}"), "guidance")
    assert len(calls) == 2


def test_a_regex_with_a_nul_is_refused_where_the_params_are_built():
    """As vLLM's: the libraries took it, and the model wrote a NUL byte into its text."""
    with pytest.raises(InvalidRequestError, match="must not contain a NUL"):
        StructuredOutputsParams(regex="a\x00b")


def test_json_object_none_is_vllms_not_asked():
    """vLLM's field is `bool | None = None`: a client that sends every field sends
    `"json_object": null` beside its constraint (it was refused: 'must be a boolean')."""
    p = StructuredOutputsParams(regex="[0-9]", json_object=None)
    assert p.kind == "regex" and p.json_object is False
    assert msgspec.convert({"choice": ["a"], "json_object": None, "json": None},
                           StructuredOutputsParams).kind == "choice"


def test_an_empty_source_line_is_not_left_in_the_reason():
    """llguidance echoes its grammar's lines under an error; an empty one ('   5 | ')
    was left in the message as '5 |'."""
    from engine.grammars import reason
    text = ('at 7(8): failed to compile JSON schema: Invalid type: nope\n   5 | \n'
            '   6 | tag_0_trig[lazy]: TAG_TEXT "<a"\n              ^\n')
    assert reason(text) == "at 7(8): failed to compile JSON schema: Invalid type: nope"

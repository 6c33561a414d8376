"""vLLM's StructuredOutputsParams.structural_tag and whitespace_pattern
(docs/STRUCTURED_OUTPUTS.md "Structural tags", "Whitespace"): a structural tag lets the
model write free text and constrains each tag its trigger opens (the `structures` form on
both backends, xgrammar's `format` form on xgrammar only); whitespace_pattern sets the
whitespace of JSON (llguidance only). What a backend cannot do is an
InvalidRequestError naming the field, at submit. Both were refused as unknown fields."""
from __future__ import annotations

import json
import re

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.config import InvalidRequestError
from tests.engine.core.test_structured_closed import backend

pytestmark = pytest.mark.timeout(600)
PROMPT = "ROMEO.\nWho art thou?\n\nJULIET.\n"      # the model answers "I am not born, ..."
WHO = {"type": "object", "properties": {"who": {"enum": ["nurse", "friar"]}},
       "required": ["who"]}
TAG = {"type": "structural_tag", "triggers": ["I am"],
       "structures": [{"begin": "I am ", "schema": WHO, "end": "."}]}
FORMAT = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["I am"],
    "tags": [{"begin": "I am ", "content": {"type": "json_schema", "json_schema": WHO},
              "end": "."}]}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.fixture(scope="module", params=["guidance", "xgrammar"])
def named_llm(request):
    return request.param, LLM(device="cpu",
                              structured_outputs_config={"backend": request.param})


def generate(llm, max_tokens=40, **so):
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, structured_outputs=so)
    return llm.generate([PROMPT], sp)[0].outputs[0]


def test_a_structural_tag_constrains_what_its_trigger_opens():
    llm = LLM(device="cpu")
    text = generate(llm, structural_tag=json.dumps(TAG)).text
    head, sep, rest = text.partition("I am ")
    assert head == "" and sep, text
    body, dot, after = rest.partition(".")
    assert json.loads(body)["who"] in ("nurse", "friar") and dot, text
    assert after                # free text again after the tag's end


@pytest.mark.parametrize("name", ["guidance", "xgrammar"])
@pytest.mark.parametrize("form", ["structures", "format"])
def test_the_matcher_checks_the_tag_body(name, form):
    if name == "guidance" and form == "format":
        return                  # refused at submit: test_what_a_backend_cannot_do_is_refused
    be, tok = backend(name)
    p = StructuredOutputsParams(structural_tag=json.dumps(TAG if form == "structures"
                                                          else FORMAT))
    compiled = be.compile(p)

    def takes(text):
        return be.matcher(compiled).consume(tok.encode(text, add_special_tokens=False).ids)

    assert takes('Good morrow. I am {"who": "nurse"}. Farewell')
    assert not takes('Good morrow. I am {"who": "romeo"}.')


def test_whitespace_pattern_sets_the_whitespace_of_json():
    llm = LLM(device="cpu")
    text = generate(llm, json=SCHEMA, whitespace_pattern="[ ]{0,3}").text
    assert json.loads(text) is not None and "\n" not in text
    assert re.search(r"\s\s", text), text        # the model takes the room it is given
    assert all(len(ws) <= 3 for ws in re.findall(r"\s+", text)), text
    assert generate(llm, json=SCHEMA).text.count(" ") <= 1    # the compact default


def test_what_a_backend_cannot_do_is_refused(named_llm):
    """xgrammar has no whitespace pattern; llguidance reads no `format` form."""
    name, llm = named_llm
    wsp = dict(json=SCHEMA, whitespace_pattern="[ ]?")
    fmt = dict(structural_tag=json.dumps(FORMAT))
    refused, served = (wsp, fmt) if name == "xgrammar" else (fmt, wsp)
    with pytest.raises(InvalidRequestError) as err:
        generate(llm, **refused)
    assert ("whitespace_pattern" if refused is wsp else "`format` form") in str(err.value)
    assert generate(llm, max_tokens=4, **served).finish_reason in ("stop", "length")


@pytest.mark.parametrize("so, says", [
    (dict(regex="[a-z]+", whitespace_pattern=" "), "applies to json"),
    (dict(json=SCHEMA, whitespace_pattern=" ", disable_any_whitespace=True), "contradict"),
    (dict(structural_tag={"structures": []}), "must be a non-empty string"),
    (dict(structural_tag="[1]"), "text of an object"),
    (dict(structural_tag=json.dumps({"triggers": ["<"], "structures": [
        {"begin": "x", "schema": {}, "end": ""}]})), "starts with none of the triggers"),
    (dict(structural_tag=json.dumps({"triggers": ["<"], "structures": [
        {"begin": "<a", "end": ""}]})), "a `schema` object"),
    (dict(structural_tag=json.dumps({"type": "json_schema"})), "type must be"),
    (dict(structural_tag="{}"), "or a `format` object"),
    (dict(structural_tag=json.dumps(TAG), json=SCHEMA), "exactly one of"),
])
def test_shapes_are_checked_where_the_params_are_built(so, says):
    with pytest.raises(InvalidRequestError, match=re.escape(says)):
        StructuredOutputsParams(**so)


def test_a_bad_whitespace_pattern_is_refused_at_submit():
    llm = LLM(device="cpu")
    with pytest.raises(InvalidRequestError, match="structured output grammar.*unclosed"):
        generate(llm, json=SCHEMA, whitespace_pattern="(")

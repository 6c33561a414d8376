"""Objects take only the properties their schema lists (docs/STRUCTURED_OUTPUTS.md
"Unlisted properties"), as vLLM's default backend (xgrammar, strict) does: the
structured_outputs_config switch disable_additional_properties (default true) closes
every object schema that lists properties and says nothing of additionalProperties, on
both backends; a schema's own `additionalProperties: true` keeps its object open, and
the switch set false gives JSON Schema's reading. llguidance allowed unlisted keys
whatever the request said by default."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.config import InvalidRequestError, StructuredOutputsConfig
from engine.grammars import closed_objects

pytestmark = pytest.mark.timeout(600)
TOKENIZER = Path(__file__).parents[3] / "engine/assets/shakespeare/tokenizer.json"
PROMPT = "ROMEO.\nWho art thou?\n\nJULIET.\n"
SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}}
EXTRA = '{"a": true, "zz": 1}'


def backend(name: str, **config):
    text = TOKENIZER.read_text()
    cfg = StructuredOutputsConfig(**config)
    tok = Tokenizer.from_str(text)
    eos = (tok.token_to_id("<|endoftext|>"),)
    if name == "xgrammar":
        from engine.core.structured.xgrammar_backend import XGrammarBackend
        return XGrammarBackend(text, tok.get_vocab_size(), eos, cfg), tok
    from engine.core.structured.guidance import GuidanceBackend
    return GuidanceBackend(text, tok.get_vocab_size(), eos, cfg), tok


def takes(name: str, schema: dict, text: str, **config) -> bool:
    """Whether `name`'s matcher of `schema` consumes the tokens of `text`."""
    be, tok = backend(name, **config)
    m = be.matcher(be.compile(StructuredOutputsParams(json=schema)))
    return m.consume(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("name", ["guidance", "xgrammar"])
def test_the_matcher_refuses_an_unlisted_key_by_default(name):
    assert takes(name, SCHEMA, '{"a": true}')
    assert not takes(name, SCHEMA, EXTRA)
    assert takes(name, dict(SCHEMA, additionalProperties=True), EXTRA)
    assert takes(name, SCHEMA, EXTRA, disable_additional_properties=False)
    nested = {"type": "object", "properties": {"m": {"type": "object"}}}
    assert takes(name, nested, '{"m": {"free": 1}}')    # no listed properties: open


@pytest.mark.parametrize("name", ["guidance", "xgrammar"])
def test_a_tuple_takes_only_its_listed_items_by_default(name):
    """As xgrammar's strict mode: llguidance let the model add items past prefixItems."""
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}]}
    assert takes(name, pair, "[1, 2]") and not takes(name, pair, "[1, 2, 3]")
    assert takes(name, pair, "[1, 2, 3]", disable_additional_properties=False)
    assert takes(name, dict(pair, items={"type": "integer"}), "[1, 2, 3]")


def biased(schema=SCHEMA, **config) -> tuple[str, str]:
    """The bundled model under `schema` with the token `z` pushed up: where the grammar
    lets it, it writes a key of z's."""
    z = Tokenizer.from_file(str(TOKENIZER)).token_to_id("z")
    llm = LLM(device="cpu", structured_outputs_config=config)
    sp = SamplingParams(max_tokens=24, temperature=0, logit_bias={z: 30.0},
                        structured_outputs={"json": schema})
    out = llm.generate([PROMPT], sp)[0].outputs[0]
    return out.text, out.finish_reason


def test_generation_keeps_to_the_listed_keys():
    text, finish = biased()
    assert finish == "stop" and set(json.loads(text)) <= {"a"}, text
    assert biased(disable_additional_properties=False)[0].startswith('{"z')


def test_a_schema_that_allows_more_keeps_it():
    assert biased(schema=dict(SCHEMA, additionalProperties=True))[0].startswith('{"z')


def test_closing_rewrites_schemas_only():
    """Data (const, enum, default) is left as given, a property named `properties` is a
    property, and an object without listed properties stays open."""
    schema = {"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "c": {"const": {"type": "object", "properties": {}}},
        "free": {"type": "object"},
        "e": {"enum": [{"properties": {}}]}},
        "$defs": {"d": {"properties": {"y": {}}}},
        "anyOf": [{"properties": {"q": {}}}, {"additionalProperties": True, "properties": {}}]}
    out = closed_objects(schema)
    p = out["properties"]
    assert out["additionalProperties"] is False
    assert p["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in p["properties"]["properties"]      # a name map
    assert p["c"] == schema["properties"]["c"] and p["e"] == schema["properties"]["e"]
    assert "additionalProperties" not in p["free"]
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert out["anyOf"][0]["additionalProperties"] is False
    assert out["anyOf"][1]["additionalProperties"] is True
    assert schema["properties"]["free"] == {"type": "object"}     # the input is untouched


def test_the_switch_is_checked_once():
    with pytest.raises(InvalidRequestError, match="disable_additional_properties must be"):
        StructuredOutputsConfig(disable_additional_properties="yes")
    assert StructuredOutputsConfig.parse('{"disable_additional_properties": false}') \
        .disable_additional_properties is False


def test_vllms_disable_fallback_is_taken():
    """vLLM's config JSON with disable_fallback (what auto always does here: no other
    backend per request) was refused as an unknown field."""
    cfg = StructuredOutputsConfig.parse('{"backend": "xgrammar", "disable_fallback": true}')
    assert cfg.backend == "xgrammar" and cfg.disable_fallback is True
    with pytest.raises(InvalidRequestError, match="disable_fallback must be a boolean"):
        StructuredOutputsConfig(disable_fallback=1)

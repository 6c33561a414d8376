"""Structured outputs' hostile and edge cases in the engine (docs/STRUCTURED_OUTPUTS.md): a
grammar that fails to compile, admits nothing, or outlives compile_timeout ends its own
request with a GRAMMAR_ERROR, and the requests beside it run as if it were not there; a
request waits visibly while it compiles and can be cancelled then; a spec over the size
limit is refused before it reaches the engine; ignore_eos and min_tokens meet the
grammar's end; the TUI's view of a step."""
from __future__ import annotations

import threading

import pytest

from engine import LLM, SamplingParams
from engine.codes import COMPILING
from engine.config import InvalidRequestError
from engine.front import processor
from engine.structured_outputs import GRAMMAR_ERROR, MAX_GRAMMAR_BYTES
from engine.core.structured.guidance import GuidanceBackend

pytestmark = pytest.mark.timeout(600)
FREE = SamplingParams(max_tokens=12, temperature=0)
PROMPT = "ROMEO.\nWho art thou?\n\nJULIET.\n"


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", check_invariants=True)


@pytest.fixture(scope="module")
def alone(llm):
    """The free neighbour's tokens with nothing beside it."""
    return llm.generate([PROMPT], FREE)[0].outputs[0].token_ids


HOSTILE = {
    "invalid": {"json": {"type": "no-such-type"}},
    "unsatisfiable (a reference to itself)": {"json": {"$ref": "#"}},
    "dangling reference": {"json": {"$ref": "#/$defs/missing"}},
    "bad regex": {"regex": "(unclosed"},
    "bad grammar": {"grammar": "start: undefined_rule"},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_grammar_that_fails_ends_its_request_only(llm, alone, name, monkeypatch):
    """The engine's own refusal: the front's check (tests/engine/test_grammars.py) is
    passed by, as a front that does not check (or an unsatisfiable grammar) does."""
    monkeypatch.setattr(processor, "check_grammar", lambda params, backend: None)
    bad = SamplingParams(max_tokens=12, structured_outputs=HOSTILE[name])
    out = llm.generate([PROMPT, PROMPT], [bad, FREE])
    assert out[0].outputs[0].finish_reason == "error"
    assert out[0].error.startswith(GRAMMAR_ERROR) and "\n" not in out[0].error, out[0].error
    assert out[1].outputs[0].token_ids == alone
    assert llm.engine.structured.active == 0 and not llm.engine.requests


def test_a_spec_over_the_size_limit_is_refused_at_submit():
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"}
                                            for i in range(MAX_GRAMMAR_BYTES // 20)}}
    with pytest.raises(InvalidRequestError, match="larger than"):
        SamplingParams(structured_outputs={"json": big})


def test_compile_timeout_ends_the_request_and_neighbours_run(monkeypatch, alone):
    """A compile that does not finish in compile_timeout (held here on an event) ends its
    request with the timeout; the free neighbour decodes meanwhile; the request shows
    as compiling while it waits."""
    gate = threading.Event()
    compile_ = GuidanceBackend.compile
    monkeypatch.setattr(GuidanceBackend, "compile",
                        lambda self, p: gate.wait(30) and compile_(self, p))
    llm = LLM(device="cpu", structured_outputs_config={"compile_timeout": 0.5})
    states = []
    slow = SamplingParams(max_tokens=8, structured_outputs={"choice": ["yes", "no"]})
    try:
        out = llm.generate([PROMPT, PROMPT], [slow, FREE], on_step=lambda e: states.append(
            e.snapshot().requests[0].state))
    finally:
        gate.set()
    assert out[0].outputs[0].finish_reason == "error"
    assert "compile_timeout" in out[0].error
    assert out[1].outputs[0].token_ids == alone
    assert COMPILING in states


def test_cancel_while_compiling(monkeypatch):
    gate = threading.Event()
    compile_ = GuidanceBackend.compile
    monkeypatch.setattr(GuidanceBackend, "compile",
                        lambda self, p: gate.wait(30) and compile_(self, p))
    llm = LLM(device="cpu")
    req = llm.add_request(PROMPT, SamplingParams(structured_outputs={"choice": ["a"]}))
    llm.engine.step()
    assert llm.engine.snapshot().request(req.request_id).state == COMPILING
    llm.engine.abort(req.request_id)
    gate.set()
    assert not llm.engine.has_unfinished() and llm.engine.structured.active == 0
    assert llm.engine.pool.num_used == 0


def test_ignore_eos_ends_when_the_grammar_takes_eos(llm):
    sp = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True,
                        structured_outputs={"choice": ["yes", "no"]})
    out = llm.generate([PROMPT], sp)[0].outputs[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")


def test_min_tokens_holds_eos_until_the_grammar_allows_nothing_else(llm):
    """A regex of letters: EOS waits for min_tokens; a choice: the grammar's end wins."""
    sp = SamplingParams(max_tokens=40, temperature=0, min_tokens=6,
                        structured_outputs={"regex": "[a-z ]{1,60}"})
    out = llm.generate([PROMPT], sp)[0].outputs[0]
    assert len(out.token_ids) >= 6
    sp = SamplingParams(max_tokens=40, temperature=0, min_tokens=20,
                        structured_outputs={"choice": ["yes", "no"]})
    out = llm.generate([PROMPT], sp)[0].outputs[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")


def test_the_view_of_a_step(llm):
    """A request that asks for logprobs (with the model's own top-n) gets each step's
    view: the allowed count, the model's top choices with the ones struck out, the token
    taken, and the state in words."""
    views = []

    def grab(engine):
        for r in engine.snapshot().requests:
            if r.grammar is not None and r.grammar.allowed >= 0:
                views.append(r.grammar)

    sp = SamplingParams(max_tokens=24, temperature=0, logprobs=5, raw_logprobs=True,
                        structured_outputs={"json": {"type": "object", "properties": {
                            "name": {"type": "string", "maxLength": 8}},
                            "required": ["name"], "additionalProperties": False}})
    llm.generate([PROMPT], sp, on_step=grab)
    first = views[0]
    # the grammar alone decides the next bytes: the object's only key
    assert first.kind == "json" and first.allowed == 1
    assert first.state == "expecting '{\"name\": \"'"
    assert first.token == llm.engine.tokenizer.encode("{")[0]
    assert any(not ok for _, _, ok in first.top)      # the model wanted other tokens
    inside = [v for v in views if v.state == "in string"]
    assert inside and all(v.allowed > 1000 for v in inside)
    for v in views:
        taken = [ok for t, _, ok in v.top if t == v.token]
        assert taken in ([], [True])                   # the token taken was allowed

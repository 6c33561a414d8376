"""Structured outputs with speculative decoding (docs/STRUCTURED_OUTPUTS.md "Speculation"): a
draft is cut to the prefix its grammar accepts, checked without advancing the matcher;
the verify rows are masked as if the drafts before them were accepted; a rejected draft
is never consumed. Greedy tokens equal the engine's without speculation (the oracle
drafter proposes the target's own tokens, some replaced by wrong ones), and sampled
outputs validate."""
from __future__ import annotations

import pytest

from benchmarks.oracle import OracleProposer
from engine import LLM
from tests.engine.core.structured_schemas import MODELS, check
from tests.engine.core.test_structured import PROMPTS, cases, constrained, run

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs without speculation, and the oracle's references: them."""
    llm = LLM(device="cpu")
    got = run(llm, dict(temperature=0))
    pairs = [[llm.inputs.process(p)[0].prompt_token_ids, list(o.token_ids)]
             for (p, _), (_, o) in zip(cases(), got)]
    return got, pairs


@pytest.mark.parametrize("acceptance", [1.0, 0.5])
def test_greedy_tokens_equal_without_speculation(reference, acceptance):
    got, refs = reference
    llm = LLM(device="cpu", check_invariants=True, num_speculative_tokens=3,
              proposer=OracleProposer(refs, acceptance))
    spec = run(llm, dict(temperature=0))
    assert [o.token_ids for _, o in spec] == [o.token_ids for _, o in got]
    c = llm.engine.counters
    assert c.spec_decode_num_draft_tokens > 0
    if acceptance == 1.0:     # every draft is the target's own token: all accepted
        assert c.spec_decode_num_accepted_tokens == c.spec_decode_num_draft_tokens
    assert llm.engine.structured.active == 0


def test_sampled_outputs_validate_with_speculation():
    llm = LLM(device="cpu", speculative_config={"method": "ngram",
                                                "num_speculative_tokens": 3})
    for model, out in run(llm, dict(temperature=1.0, seed=3)):
        assert out.finish_reason == "stop", out.text
        check(model, out.text)


def test_a_draft_is_cut_where_the_grammar_refuses_it():
    """validate_drafts: the longest accepted prefix, and the matcher does not move (its
    next mask is the same before and after)."""
    llm = LLM(device="cpu")
    req = llm.add_request(PROMPTS[0], constrained(MODELS[1], temperature=0))
    eng = llm.engine
    while not req.grammar.ready:
        eng.structured.wait(1.0)
        eng.step()
    tok = eng.tokenizer
    good = tok.encode('{"item": "sword"', add_special_tokens=False)
    bad = tok.encode("}", add_special_tokens=False)
    m = req.grammar.matcher
    assert eng.structured.validate_drafts(req, good + bad + good) == good
    assert eng.structured.validate_drafts(req, bad + good) == []
    assert m.consume(good)            # nothing was consumed by the checks above
    eng.abort(req.request_id)

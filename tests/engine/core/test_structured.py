"""Structured outputs in the engine (docs/STRUCTURED_OUTPUTS.md) on the bundled model: every
finished output under a schema validates (nested objects, enums, arrays; greedy and
sampled), through async scheduling (the deferred mask), speculative decoding (drafts
cut to what the grammar accepts, rejected ones never consumed), preemption, prefix
caching, n > 1, penalties and logit_bias; each matcher has consumed exactly its
request's output after every step."""
from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from tests.engine.core.structured_schemas import MAX_TOKENS, MODELS, check, schema

pytestmark = pytest.mark.timeout(900)
PROMPTS = ["ROMEO.\nWho art thou?\n\nJULIET.\n", "KING HENRY.\nSpeak, what news?\n\n"]


def constrained(model, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, structured_outputs={"json": schema(model)}, **kw)


def cases():
    """(prompt, model) for each schema and prompt: each prompt names its schema, so no
    two requests share a prompt (the oracle drafter finds a reference by its prompt)."""
    return [(f"{m.__name__.upper()}.\n{p}", m) for m in MODELS for p in PROMPTS]


def consumed_all(engine) -> None:
    """After a step: each running constrained request's matcher has consumed its whole
    output (no pending token is left unread when step() returns)."""
    for req in engine.requests.values():
        g = req.grammar
        if g is not None and g.ready:
            assert g.consumed == len(req.output_token_ids) - req.num_pending, req.request_id


def run(llm, sampling: dict, **kw):
    pairs = cases()
    outs = llm.generate([p for p, _ in pairs],
                        [constrained(m, **sampling, **kw) for _, m in pairs],
                        on_step=consumed_all)
    return [(m, o.outputs[0]) for (_, m), o in zip(pairs, outs)]


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", check_invariants=True)


@pytest.fixture(scope="module")
def greedy(llm):
    return run(llm, dict(temperature=0))


def test_greedy_outputs_validate_against_their_schemas(greedy):
    for model, out in greedy:
        assert out.finish_reason == "stop", out.text
        check(model, out.text)


def test_sampled_outputs_validate_against_their_schemas(llm):
    for model, out in run(llm, dict(temperature=1.0, seed=7)):
        assert out.finish_reason == "stop", out.text
        check(model, out.text)
    counters = llm.engine.counters
    assert counters.grammar_compiles == len(MODELS)      # one compile per schema, cached
    assert counters.grammar_rows >= counters.grammar_steps > 0


def test_the_mask_is_what_makes_it_json(llm):
    """The same prompt free: the model writes verse, not JSON."""
    free = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=24, temperature=0))[0]
    with pytest.raises(ValueError):
        json.loads(free.outputs[0].text)


def test_async_deferred_mask_gives_the_synchronous_tokens(greedy):
    """Async scheduling fills a chained step's mask after the previous tokens are read
    (the forward runs first): the tokens equal a synchronous engine's."""
    sync = run(LLM(device="cpu", async_scheduling=False), dict(temperature=0))
    assert [o.token_ids for _, o in sync] == [o.token_ids for _, o in greedy]


def test_preemption_and_prefix_hits_keep_the_tokens(greedy):
    """A pool too small for the batch (preemption, recompute), chunked prefill, and the
    second prompt's prefix cached: the matchers keep their state through all of it."""
    llm = LLM(device="cpu", num_blocks=20, block_size=8, max_num_batched_tokens=16,
              check_invariants=True)
    got = run(llm, dict(temperature=0))
    assert llm.engine.counters.preemptions > 0
    assert [o.token_ids for _, o in got] == [o.token_ids for _, o in greedy]
    assert llm.engine.structured.active == 0


def test_n_choices_penalties_and_bias_stay_valid(llm):
    """Several seeded choices of one prompt (same-prompt dedup), with penalties and a
    logit_bias of +100 on a token the grammar forbids: the mask wins."""
    quote = 2                    # '"': never allowed right after the opening '{' ... ':'
    sp = [constrained(MODELS[1], temperature=0.8, seed=s, frequency_penalty=0.5,
                      presence_penalty=0.3, logit_bias={quote: 100.0, 92: 5.0})
          for s in range(4)]
    for o in llm.generate([PROMPTS[0]] * 4, sp):
        assert o.outputs[0].finish_reason == "stop"
        check(MODELS[1], o.outputs[0].text)

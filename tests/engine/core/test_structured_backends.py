"""The grammar backends behind one interface (docs/STRUCTURED_OUTPUTS.md "Choosing the
library"): xgrammar, the alternative to llguidance, gives outputs that validate for each
kind (JSON schemas, choice, regex, a GBNF and a Lark grammar) and refuses a bad schema
with a clean message; with speculative decoding (its drafts checked token by token, then
rolled back) its greedy tokens are the ones it gives without; the config's backend names
(vLLM's, "llguidance" read as "guidance"; auto falls back to xgrammar where llguidance
cannot read the tokenizer); vLLM's Python API (StructuredOutputsParams)."""
from __future__ import annotations

from types import SimpleNamespace

import llguidance
import pytest

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.config import InvalidRequestError, StructuredOutputsConfig
from engine.core.structured import make_manager
from engine.front import processor
from engine.structured_outputs import GRAMMAR_ERROR
from tests.engine.core.structured_schemas import check
from tests.engine.core.test_structured import cases, run

pytestmark = pytest.mark.timeout(900)
XGRAMMAR = {"backend": "xgrammar"}


@pytest.fixture(scope="module")
def xllm():
    return LLM(device="cpu", check_invariants=True, structured_outputs_config=XGRAMMAR)


@pytest.fixture(scope="module")
def reference(xllm):
    """xgrammar's greedy outputs, and the oracle drafter's references: them."""
    got = run(xllm, dict(temperature=0))
    pairs = [[xllm.inputs.process(p)[0].prompt_token_ids, list(o.token_ids)]
             for (p, _), (_, o) in zip(cases(), got)]
    return got, pairs


def test_xgrammar_outputs_validate(xllm, reference):
    assert xllm.engine.structured.backend.ready.name == "xgrammar"
    for model, out in reference[0]:
        assert out.finish_reason == "stop", out.text
        check(model, out.text)


def test_xgrammar_with_speculation_gives_the_same_tokens(reference):
    got, refs = reference
    llm = LLM(device="cpu", check_invariants=True, structured_outputs_config=XGRAMMAR,
              num_speculative_tokens=3, proposer=OracleProposer(refs, 0.5))
    spec = run(llm, dict(temperature=0))
    assert [o.token_ids for _, o in spec] == [o.token_ids for _, o in got]
    c = llm.engine.counters
    assert c.spec_decode_num_draft_tokens > c.spec_decode_num_accepted_tokens > 0


def test_xgrammar_kinds_and_a_clean_error(xllm, monkeypatch):
    """Its error text without the C++ source path, both where the front's check refuses
    the spec and where the engine's compile does (the check passed by)."""
    kinds = [{"choice": ["aye", 'nay, "sir"']}, {"regex": "[0-9]{3}"},
             {"grammar": 'root ::= "yes" | "no"'}, {"grammar": 'start: "yes" | "no"'}]
    bad = {"json": {"type": "no-such-type"}}
    with pytest.raises(InvalidRequestError) as refused:
        llm_texts(xllm, [bad])
    with monkeypatch.context() as m:
        m.setattr(processor, "check_grammar", lambda params, backend: None)
        outs = llm_texts(xllm, kinds + [bad])
    assert outs[0][0] in ("aye", 'nay, "sir"') and outs[1][0].isdigit()
    assert outs[2][0] in ("yes", "no") and outs[3][0] in ("yes", "no")
    for error in (outs[4][1], str(refused.value)):
        assert error.startswith(GRAMMAR_ERROR) and "no-such-type" in error and ".cc:" not in error


def test_xgrammar_lark_takes_the_models_special_tokens(xllm):
    """A Lark grammar naming a special token: the front's check (no tokenizer) lets the
    engine decide, and the engine reads it with the model's tokenizer."""
    out = llm_texts(xllm, [{"grammar": 'start: "aye" <|endoftext|>'}])
    assert out == [("aye", None)]


def llm_texts(llm, kinds: list[dict]) -> list[tuple[str, str | None]]:
    outs = llm.generate([f"{i}:" for i in range(len(kinds))],
                        [SamplingParams(max_tokens=12, temperature=0, structured_outputs=k)
                         for k in kinds])
    return [(o.outputs[0].text, o.error) for o in outs]


def test_backend_names():
    assert StructuredOutputsConfig(backend="llguidance").backend == "guidance"
    assert StructuredOutputsConfig.parse('{"backend": "xgrammar"}').backend == "xgrammar"
    assert StructuredOutputsConfig.parse(None).backend == "auto"
    with pytest.raises(InvalidRequestError, match="backend must be one of auto, guidance"):
        StructuredOutputsConfig(backend="outlines")


def test_vllm_python_api(xllm):
    """SamplingParams(structured_outputs=StructuredOutputsParams(...)) as in vLLM; one
    constraint per request."""
    sp = SamplingParams(max_tokens=8, temperature=0,
                        structured_outputs=StructuredOutputsParams(choice=["aye", "nay"]))
    assert xllm.generate(["ROMEO.\n"], sp)[0].outputs[0].text in ("aye", "nay")
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        StructuredOutputsParams(regex="a", choice=["b"])


def test_auto_falls_back_to_xgrammar_where_llguidance_cannot_read_the_tokenizer(
        xllm, monkeypatch):
    def unreadable(*args, **kwargs):
        raise ValueError("a tokenizer llguidance cannot read")
    monkeypatch.setattr(llguidance, "LLTokenizer", unreadable)

    def backend(name: str):
        config = SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(backend=name))
        manager = make_manager(config, xllm.engine.tokenizer, xllm.engine.vocab_size, (0,),
                               False, SimpleNamespace())
        try:
            return manager.backend.get()
        finally:
            manager.close()
    assert backend("auto").name == "xgrammar"
    with pytest.raises(ValueError, match="cannot read"):
        backend("guidance")


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_constrained_request_ended_by_its_grammar_fails_no_step(backend):
    """Async scheduling: a constrained request that asks logprobs and ignores EOS ends
    when its grammar takes EOS, while the next step, launched before, still has its
    row; that step's grammar view of it must not ask the finished matcher what comes
    next (xgrammar raises on a terminated matcher: the step failed, and its requests
    were rerun one by one)."""
    llm = LLM(model="dummy:tiny", device="cpu", async_scheduling=True,
              structured_outputs_config={"backend": backend})
    outs = llm.generate(
        [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 9]}],
        [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1,
                        structured_outputs={"choice": ["yes", "no"]}),
         SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)])
    assert [o.outputs[0].finish_reason for o in outs] == ["stop", "length"]
    assert llm.engine.stats.last_error is None, llm.engine.stats.last_error

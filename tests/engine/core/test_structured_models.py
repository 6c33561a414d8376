"""Structured outputs beyond the bundled model in one process: a random-weight model
with the bundled tokenizer (any tokens the mask allows; greedy, sampled, with
speculation), a dummy preset with no tokenizer (the synthetic vocabulary of its size:
engine/core/structured/vocab.py), and the engine in its own process (the constraint
crosses the wire inside SamplingParams)."""
from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer

from engine import LLM, SamplingParams
from engine.config import InvalidRequestError
from engine.core.structured.vocab import synthetic_tokenizer_json
from engine.front.client import EngineClient
from engine.structured_outputs import GRAMMAR_ERROR
from engine.tokenizer import DEFAULT_MODEL_DIR
from tests.engine.core.structured_schemas import MAX_TOKENS, MODELS, check, schema
from tests.hf_models import CONFIGS, make_checkpoint

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """A tiny random Llama over the bundled model's 4096-token vocabulary and tokenizer."""
    path = tmp_path_factory.mktemp("random-llama")
    make_checkpoint({**CONFIGS["llama"], "vocab_size": 4096, "eos_token_id": 0,
                     "bos_token_id": 0}, path, seed=3)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEFAULT_MODEL_DIR / name, path / name)
    return str(path)


@pytest.mark.parametrize("sampling,spec", [
    (dict(temperature=0), None),
    (dict(temperature=1.0, seed=11), None),
    (dict(temperature=1.0, seed=12), {"method": "ngram", "num_speculative_tokens": 2})])
def test_random_model_outputs_validate(random_model, sampling, spec):
    llm = LLM(model=random_model, device="cpu", speculative_config=spec)
    prompts = [f"{m.__name__}:" for m in MODELS]
    outs = llm.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, **sampling,
                                                 structured_outputs={"json": schema(m)})
                                  for m in MODELS])
    for model, o in zip(MODELS, outs):
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        check(model, o.outputs[0].text)


def test_dummy_preset_masks_over_a_synthetic_vocabulary():
    """dummy:tiny has no tokenizer: the grammar masks over a byte-level vocabulary of
    the model's 512 tokens, which decodes the output (the front cannot)."""
    llm = LLM(model="dummy:tiny", device="cpu")
    model = MODELS[1]
    outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2,
                        [SamplingParams(max_tokens=MAX_TOKENS, temperature=t, seed=1,
                                        structured_outputs={"json": schema(model)})
                         for t in (0, 1.0)])
    vocab = Tokenizer.from_str(synthetic_tokenizer_json(
        llm.engine.vocab_size, tuple(llm.engine.eos_token_ids) or (llm.engine.vocab_size - 1,)))
    for o in outs:
        assert o.outputs[0].finish_reason == "stop"
        text = vocab.decode(list(o.outputs[0].token_ids), skip_special_tokens=True)
        check(model, text)


def test_the_engine_process_carries_the_constraint():
    with EngineClient(model="default", device="cpu", label="structured") as client:
        ok = client.submit("ROMEO.\n", SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0,
            structured_outputs={"json": schema(MODELS[0])})).result(timeout=300)
        bad = client.submit("ROMEO.\n", SamplingParams(   # unsatisfiable: the engine's
            max_tokens=8, structured_outputs={"json": {"$ref": "#"}})   # compile refuses it
        ).result(timeout=300)
        with pytest.raises(InvalidRequestError, match=GRAMMAR_ERROR):   # the front's check
            client.submit("ROMEO.\n", SamplingParams(
                max_tokens=8, structured_outputs={"json": {"type": "no-such-type"}}))
    check(MODELS[0], ok.outputs[0].text)
    assert bad.outputs[0].finish_reason == "error" and bad.error.startswith(GRAMMAR_ERROR)
    json.loads(ok.outputs[0].text)

"""LLM.generate / chat without SamplingParams use the model's generation config (vLLM's
LLM.get_default_sampling_params, generation_config="auto"): the bundled model's
max_new_tokens 256 where SamplingParams() gave 16; a folder's file; none with "vllm".
Explicit SamplingParams are taken as given. A bad generation_config is refused before
the model loads."""
from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from engine.config import InvalidRequestError

PROMPTS = ["ROMEO.\nWhat news?\n", "JULIET.\n"]


def max_tokens_run(llm, *args, **kwargs) -> list[int]:
    """The max_tokens each request of a generate() call ran with (read in its first step)."""
    seen = []
    def look(engine):
        if not seen:
            seen.extend(r.params.max_tokens for r in engine.requests.values())
    llm.generate(*args, on_step=look, **kwargs)
    return seen


def test_the_bundled_models_generation_config_sets_max_tokens_256():
    with LLM(device="cpu") as llm:
        assert llm.get_default_sampling_params() == SamplingParams(max_tokens=256)
        assert max_tokens_run(llm, PROMPTS) == [256, 256]       # it was 16
        given = SamplingParams(max_tokens=5)                   # taken as given
        assert max_tokens_run(llm, PROMPTS, [None, given]) == [256, 5]
    with LLM(device="cpu", generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
        assert max_tokens_run(llm, PROMPTS) == [16, 16]


@pytest.fixture(scope="module")
def greedy_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("generation")
    (path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "repetition_penalty": 1.3, "max_new_tokens": 10, "top_p": None}))
    return str(path)


def test_a_folders_generation_config_is_the_default_of_generate_and_chat(greedy_folder):
    want = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=10)
    with LLM(device="cpu", generation_config=greedy_folder) as llm:
        assert llm.get_default_sampling_params() == want
        ids = [o.outputs[0].token_ids for o in llm.generate(PROMPTS)]
        assert ids == [o.outputs[0].token_ids for o in llm.generate(PROMPTS, want)]
        assert max_tokens_run(llm, PROMPTS) == [10, 10]
        chat = [{"role": "user", "content": "What news?"}]
        assert llm.chat(chat)[0].outputs[0].token_ids == \
            llm.chat(chat, want)[0].outputs[0].token_ids


@pytest.mark.parametrize("value,why", [
    ("/nonexistent/folder", "is not a folder"), ("", "must be auto, vllm or a folder"),
    (3, "must be auto, vllm or a folder")])
def test_a_generation_config_that_is_no_folder_is_refused(value, why):
    with pytest.raises(InvalidRequestError, match=why):
        LLM(device="cpu", generation_config=value)


def test_a_folder_without_the_file_or_with_a_bad_value_is_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="holds no generation_config.json"):
        LLM(device="cpu", generation_config=str(tmp_path))
    (tmp_path / "generation_config.json").write_text('{"top_p": 2.0}')
    with pytest.raises(InvalidRequestError) as exc:
        LLM(device="cpu", generation_config=str(tmp_path))
    assert str(tmp_path / "generation_config.json") in str(exc.value)
    assert "top_p must be in (0, 1], got 2.0" in str(exc.value)

"""engine/worker/models/loader.py default_sampling_params: vLLM's get_diff_sampling_param
over a model's generation config (the six sampling fields that hold a value,
max_new_tokens as max_tokens), config.json's fields when the checkpoint has no
generation_config.json, nothing for a dummy preset or "vllm"; a bad value names the
file and the field."""
from __future__ import annotations

import json

import pytest

from engine.config import InvalidRequestError, make_config
from engine.worker.models.loader import default_sampling_params


def test_the_bundled_model_sets_max_tokens_only():
    """Its file also says do_sample false and token ids: not sampling defaults (vLLM
    reads none of them)."""
    assert default_sampling_params("default") == {"max_tokens": 256}
    assert default_sampling_params("default", "vllm") == {}
    assert default_sampling_params("dummy:tiny") == {}


def test_every_field_is_read_and_nulls_are_left_out(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "repetition_penalty": 1.1, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
        "min_p": None, "max_new_tokens": 512, "max_length": 4096, "do_sample": True}))
    assert default_sampling_params("dummy:tiny", str(tmp_path)) == {
        "repetition_penalty": 1.1, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
        "max_tokens": 512}


def test_a_checkpoint_without_the_file_gives_its_config_jsons_fields(tmp_path):
    """transformers' GenerationConfig.from_model_config, which vLLM falls back to."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "temperature": 0.7, "top_k": None}))
    assert default_sampling_params(str(tmp_path)) == {"temperature": 0.7}
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.8}))
    assert default_sampling_params(str(tmp_path)) == {"top_p": 0.8}


@pytest.mark.parametrize("text,why", [
    ('{"temperature": "hot"}', "temperature"), ('{"max_new_tokens": 0}', "max_tokens"),
    ('{"top_k": 2.5}', "top_k"), ("[1, 2]", "must be an object"),
    ("{not json", "is not JSON")])
def test_a_bad_file_is_refused_naming_it(tmp_path, text, why):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(InvalidRequestError, match=why) as exc:
        default_sampling_params("dummy:tiny", str(tmp_path))
    assert str(tmp_path / "generation_config.json") in str(exc.value)


def test_override_generation_config_is_set_over_the_file():
    """vLLM's --override-generation-config: its fields over the file's (null takes one
    out), with `vllm` over nothing."""
    assert default_sampling_params("default", override={"temperature": 0.5}) == {
        "max_tokens": 256, "temperature": 0.5}
    assert default_sampling_params("default", override={"max_new_tokens": 8}) == {
        "max_tokens": 8}
    assert default_sampling_params("default", override={"max_new_tokens": None}) == {}
    assert default_sampling_params("default", "vllm", {"top_k": 5}) == {"top_k": 5}


@pytest.mark.parametrize("value,why", [
    ('{"do_sample": true}', "do_sample sets no sampling default"),
    ('{"temperature": -1}', "temperature"), ('{"max_new_tokens": 0}', "max_tokens"),
    ('["temperature"]', "must be an object"), ("{not json", "is not JSON")])
def test_a_bad_override_is_refused_by_the_config(value, why):
    with pytest.raises(InvalidRequestError, match=why):
        make_config(override_generation_config=value)
    assert make_config(override_generation_config='{"top_p": 0.9}'
                       ).override_generation_config == {"top_p": 0.9}

"""vLLM's --generation-config and --override-generation-config: where a model's default
sampling parameters come from (its generation_config.json, a folder's, none) and the
fields they take. A module of its own: the check of an override builds SamplingParams,
whose module must not import engine/config.py back (docs/SAMPLING.md "Default sampling
parameters")."""
from __future__ import annotations

import os

from engine.config_json import json_object
from engine.errors import InvalidRequestError
from engine.request import SamplingParams

# vLLM's --generation-config values besides a folder: the model's file, or none
GENERATION_CONFIG_MODES = ("auto", "vllm")
GENERATION_CONFIG_FILE = "generation_config.json"
# the generation-config fields that become default sampling parameters (vLLM's
# ModelConfig.get_diff_sampling_param); HF's max_new_tokens is the engine's max_tokens
GENERATION_SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p",
                              "max_new_tokens")


def check_generation_config(value) -> str:
    """generation_config: auto, vllm, or a folder holding generation_config.json (what
    the file says is checked as the engine starts: engine/worker/models/loader.py)."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"generation_config must be auto, vllm or a folder, got "
                                  f"{value!r}")
    if value in GENERATION_CONFIG_MODES:
        return value
    if not os.path.isdir(value):
        raise InvalidRequestError(f"generation_config {value!r} is not a folder (auto: the "
                                  f"model's {GENERATION_CONFIG_FILE}; vllm: none)")
    if not os.path.isfile(os.path.join(value, GENERATION_CONFIG_FILE)):
        raise InvalidRequestError(f"generation_config {value!r} holds no "
                                  f"{GENERATION_CONFIG_FILE}")
    return value


def parse_override_generation_config(value) -> dict | None:
    """vLLM's --override-generation-config: generation-config fields (a JSON object or its
    text) set over what --generation-config gives (a null takes the field out). A key that
    sets no sampling default (vLLM keeps it and nothing reads it) is refused, and so is a
    value SamplingParams refuses."""
    if value is None:
        return None
    value = json_object(value, "override_generation_config")
    if other := sorted(map(str, set(value) - set(GENERATION_SAMPLING_FIELDS))):
        raise InvalidRequestError(f"override_generation_config: {', '.join(other)} sets no "
                                  f"sampling default (it takes "
                                  f"{', '.join(GENERATION_SAMPLING_FIELDS)})")
    try:
        SamplingParams(**sampling_defaults(value))
    except (InvalidRequestError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"override_generation_config: {exc}") from None
    return dict(value)


def sampling_defaults(generation_config: dict) -> dict:
    """The default sampling parameters a generation config's fields set (those of
    GENERATION_SAMPLING_FIELDS that hold a value; max_new_tokens as max_tokens)."""
    found = {name: generation_config[name] for name in GENERATION_SAMPLING_FIELDS
             if generation_config.get(name) is not None}
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    return found

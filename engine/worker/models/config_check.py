"""Checkpoint configs checked as data from a stranger: every size the model builds from is
a positive integer in range, named in the error (before anything is allocated)."""
from __future__ import annotations

import json
import os

from engine.config import InvalidRequestError

# the config fields that set a model's longest context, first found wins (vLLM's derived
# max_model_len): Llama-likes' and GPT-2's (which transformers maps to the first)
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")

# The rope table is built for every position (float32, head_dim wide): 2M positions at
# head_dim 128 is 1 GiB. Longer contexts are refused rather than allocated blindly.
MAX_POSITIONS = 1 << 21


def positive_int(cfg, field: str, maximum: int | None = None, default=None) -> int:
    value = getattr(cfg, field, None)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (
            maximum is not None and value > maximum):
        bound = f"in [1, {maximum}]" if maximum else ">= 1"
        raise InvalidRequestError(f"config field {field} must be an integer {bound}, "
                                  f"got {value!r}")
    return value


def check_llama_config(cfg) -> None:
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "vocab_size"):
        positive_int(cfg, field)
    positive_int(cfg, "max_position_embeddings", MAX_POSITIONS)
    heads = cfg.num_attention_heads
    kv = positive_int(cfg, "num_key_value_heads", default=heads)
    if heads % kv:
        raise InvalidRequestError(f"config field num_key_value_heads ({kv}) must divide "
                                  f"num_attention_heads ({heads})")
    if getattr(cfg, "head_dim", None) is not None:
        positive_int(cfg, "head_dim")
    elif cfg.hidden_size % heads:
        raise InvalidRequestError(f"config field num_attention_heads ({heads}) must divide "
                                  f"hidden_size ({cfg.hidden_size}) when head_dim is not set")


def check_gpt2_config(cfg) -> None:
    for field in ("n_embd", "n_layer", "n_head", "vocab_size"):
        positive_int(cfg, field)
    positive_int(cfg, "n_positions", MAX_POSITIONS)
    if cfg.n_embd % cfg.n_head:
        raise InvalidRequestError(f"config field n_head ({cfg.n_head}) must divide n_embd "
                                  f"({cfg.n_embd})")


def context_length(cfg) -> tuple[str, int] | None:
    """(field, value) of a config's longest context: an HF config's attributes or
    config.json's dict; None where it names none."""
    for field in CONTEXT_FIELDS:
        value = cfg.get(field) if isinstance(cfg, dict) else getattr(cfg, field, None)
        if value:
            return field, value
    return None


class ConfigFiles:
    """The small files of one start (config.json, generation_config.json), each read
    once: the checks before the load and the load share what was read (a file that
    could not be read raises its error again)."""

    def __init__(self) -> None:
        self._texts: dict[str, str | OSError] = {}

    def text(self, file: str) -> str:
        got = self._texts.get(file)
        if got is None:
            try:
                with open(file) as f:
                    got = f.read()
            except OSError as exc:
                got = exc
            self._texts[file] = got
        if isinstance(got, OSError):
            raise got
        return got


def local_context_length(name: str, files: ConfigFiles | None = None
                         ) -> tuple[str, int] | None:
    """The context length of a model found here (a dummy preset, the bundled model, a
    checkpoint directory), read without torch or transformers, for a check before the
    slow start; None for a hub id (not fetched for a check) or an unreadable config
    (the loader names what is wrong). `files`: the start's, which the load reads again."""
    from engine.tokenizer import resolve_model_path
    from engine.worker.models.presets import PRESETS, preset_fields
    if not isinstance(name, str):
        return None
    if name.startswith("dummy:"):
        preset = name.removeprefix("dummy:")
        return context_length(preset_fields(preset)) if preset in PRESETS else None
    try:
        cfg = json.loads((files or ConfigFiles()).text(
            os.path.join(resolve_model_path(name), "config.json")))
    except (OSError, ValueError):
        return None
    return context_length(cfg) if isinstance(cfg, dict) else None

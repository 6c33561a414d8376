"""Checkpoint configs checked as data from a stranger: every size the model builds from is
a positive integer in range, named in the error (before anything is allocated)."""
from __future__ import annotations

from engine.config import InvalidRequestError

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

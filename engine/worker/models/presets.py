"""Named dummy presets: real architectures (HF configs) for random-weight runs.

preset_config builds a preset's config without transformers (importing it costs an
engine process ~5 s of CPU, more than starting dummy:tiny does otherwise), like the
bundled model's config.json (loader.bundled_config): the fields the model code reads,
with transformers' defaults where a preset leaves one out (tests/engine/worker/
test_presets.py compares every preset with AutoConfig.for_model, preset_hf_config)."""
from __future__ import annotations

from types import SimpleNamespace

from engine.config import InvalidRequestError

PRESETS = {
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2,
                                   vocab_size=151936, max_position_embeddings=32768,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151936, max_position_embeddings=40960,
                                 rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True)),
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   vocab_size=128256, max_position_embeddings=131072,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True,
                                   rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192},
                                   rope_theta=500000.0)),
    # real 7-8B shapes (tensor-parallel benchmarks with dummy weights)
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256,
                                   max_position_embeddings=131072, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192},
                                   rope_theta=500000.0)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4,
                                 vocab_size=152064, max_position_embeddings=32768,
                                 rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False)),
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)),
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                           max_position_embeddings=2048, tie_word_embeddings=False)),
    "tiny-gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=1024)),
}


# transformers' defaults for the fields the engine reads that a preset may leave out; a
# field transformers' config class lacks stays absent (the model code has its default)
DEFAULTS = {
    "llama": dict(attention_bias=False, mlp_bias=False, eos_token_id=2, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, max_position_embeddings=2048),
    "qwen2": dict(eos_token_id=None),
    "qwen3": dict(attention_bias=False, head_dim=128, eos_token_id=None),
    "gpt2": dict(eos_token_id=50256, layer_norm_epsilon=1e-5, n_inner=None,
                 tie_word_embeddings=True),
}


def _preset(name: str) -> tuple[str, dict]:
    if name not in PRESETS:
        raise InvalidRequestError(f"unknown dummy preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    model_type, kwargs = PRESETS[name]
    return model_type, dict(kwargs)


def preset_fields(name: str) -> dict:
    """The preset's fields with the defaults it leaves out, as plain data (no transformers)."""
    model_type, kwargs = _preset(name)
    return dict(DEFAULTS[model_type], model_type=model_type, **kwargs)


def preset_config(name: str):
    """The preset's config: plain attributes, or AutoConfig's where its rope scaling needs
    transformers' rope functions (which take a whole HF config) anyway."""
    model_type, kwargs = _preset(name)
    if "rope_scaling" in kwargs:
        return preset_hf_config(name)
    cfg = preset_fields(name)
    if model_type == "gpt2":        # GPT2Config's attribute_map: the common names too
        cfg.update(hidden_size=cfg["n_embd"], num_attention_heads=cfg["n_head"],
                   num_hidden_layers=cfg["n_layer"], max_position_embeddings=cfg["n_positions"])
        return SimpleNamespace(**cfg)
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    if model_type == "llama":
        cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg["rope_parameters"] = {"rope_type": "default",
                              "rope_theta": cfg.pop("rope_theta", 10000.0)}
    return SimpleNamespace(**cfg)


def preset_hf_config(name: str):
    """The preset as transformers' AutoConfig (an HF model built from it: the oracle)."""
    from transformers import AutoConfig
    model_type, kwargs = _preset(name)
    if "rope_scaling" in kwargs or "rope_theta" in kwargs:
        rope = dict(kwargs.pop("rope_scaling", None) or {"rope_type": "default"})
        rope["rope_theta"] = kwargs.pop("rope_theta", 10000.0)
        kwargs["rope_parameters"] = rope
    return AutoConfig.for_model(model_type, **kwargs)

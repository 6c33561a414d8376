"""Tiny random HF checkpoints built with transformers and saved to disk (test helpers)."""
from __future__ import annotations

import torch

CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                  max_position_embeddings=2048, tie_word_embeddings=False),
    # Qwen2: qkv bias, GQA group of 3 (not a power of two), tied embeddings
    "qwen2": dict(model_type="qwen2", hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, vocab_size=320,
                  max_position_embeddings=512, tie_word_embeddings=True, rope_theta=1000000.0),
    # Qwen3: q/k norm, explicit head_dim, MHA-ish group of 1? use 4/4 -> group 1
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, head_dim=32, vocab_size=320,
                  max_position_embeddings=512, tie_word_embeddings=False),
    # Llama with llama3 rope scaling and group size 7 (Qwen2.5-0.5B's)
    "llama-gqa7": dict(model_type="llama", hidden_size=224, intermediate_size=160,
                       num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
                       vocab_size=320, max_position_embeddings=1024, tie_word_embeddings=True,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 256}),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=320, n_positions=512),
}


def make_checkpoint(kind: str, path, seed: int = 0, with_tokenizer: bool = False):
    """Build a random-weight HF model of `kind` (a CONFIGS key or a config dict), save it
    (safetensors) to `path`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    kwargs = dict(CONFIGS[kind] if isinstance(kind, str) else kind)
    model_type = kwargs.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    # make the weights less uniform than HF init so greedy paths are not trivially repetitive
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1.0, 0.2)     # two different per-head norms (the engine runs both
                #                         in one launch, a weight row per head)
    model.save_pretrained(path, safe_serialization=True)
    return model

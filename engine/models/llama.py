"""The Llama family (Llama, Qwen2 with qkv bias, Qwen3 with q/k norm, Mistral, SmolLM).

Runs a flattened batch of tokens from many requests against the paged KV cache.
q/k/v and gate/up projections are fused into single matmuls; weights load from HF names.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from engine.models.layers import (AttentionMetadata, PagedAttention, rope_cos_sin_cache,
                                  rope_inv_freq)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, model):
        super().__init__()
        object.__setattr__(self, "model", model)  # ops / rope cache; not a submodule
        h, d = cfg.hidden_size, model.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                            model.num_kv_heads, d)
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, h, bias=bool(getattr(cfg, "attention_bias", False)))
        self.gate_up_proj = nn.Linear(h, 2 * cfg.intermediate_size,
                                      bias=bool(getattr(cfg, "mlp_bias", False)))
        self.down_proj = nn.Linear(cfg.intermediate_size, h,
                                   bias=bool(getattr(cfg, "mlp_bias", False)))
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(d))
            self.k_norm = nn.Parameter(torch.ones(d))
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d ** -0.5)

    def forward(self, positions, hidden, residual, meta: AttentionMetadata):
        ops, eps = self.model.ops, self.model.eps
        # RMSNorm fused into the projections that follow it (skinny decode batches)
        if residual is None:
            residual = hidden
            qkv = ops.rms_norm_linear(hidden, self.input_layernorm, eps,
                                      self.qkv_proj.weight, self.qkv_proj.bias)
        else:
            qkv, residual = ops.rms_norm_linear(hidden, self.input_layernorm, eps,
                                                self.qkv_proj.weight, self.qkv_proj.bias,
                                                residual)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = hidden.shape[0]
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = ops.rms_norm(q, self.q_norm, eps)
            k = ops.rms_norm(k, self.k_norm, eps)
        # rotary + this step's K/V into the paged cache in one op; attention skips its store
        q = ops.rotary_store_kv(positions, q, k, v, self.model.cos_sin_cache, True,
                                self.attn.k_cache, self.attn.v_cache, meta.slot_mapping)
        attn = self.attn(q, k, v, meta, kv_stored=True)
        hidden = ops.linear(attn.reshape(t, self.q_size), self.o_proj.weight, self.o_proj.bias)
        gate_up, residual = ops.rms_norm_linear(hidden, self.post_attention_layernorm, eps,
                                                self.gate_up_proj.weight,
                                                self.gate_up_proj.bias, residual)
        hidden = ops.silu_mul_linear(gate_up, self.down_proj.weight, self.down_proj.bias)
        return hidden, residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.ops = None
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, self) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.tie = bool(getattr(cfg, "tie_word_embeddings", False))
        self.lm_head = None if self.tie else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv_freq, scaling = rope_inv_freq(cfg, self.head_dim)
        self.register_buffer("cos_sin_cache", rope_cos_sin_cache(
            inv_freq, cfg.max_position_embeddings, scaling), persistent=False)

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.attn for layer in self.layers]

    def forward(self, input_ids, positions, meta: AttentionMetadata,
                logits_indices: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, residual = hidden[logits_indices], residual[logits_indices]
        weight = self.embed_tokens.weight if self.tie else self.lm_head.weight
        logits, _ = self.ops.rms_norm_linear(hidden, self.norm, self.eps, weight, None, residual)
        return logits   # model dtype: argmax needs no upcast

    # -- weights ---------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into this model; returns the names of filled params."""
        params = dict(self.named_parameters())
        q, kv = self.layers[0].q_size, self.layers[0].kv_size
        inter = self.config.intermediate_size
        stacked = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", q),
                   "v_proj": ("qkv_proj", q + kv), "gate_proj": ("gate_up_proj", 0),
                   "up_proj": ("gate_up_proj", inter)}
        renames = {"self_attn.": "", "mlp.": "", "model.": "",
                   "input_layernorm.weight": "input_layernorm",
                   "post_attention_layernorm.weight": "post_attention_layernorm",
                   "q_norm.weight": "q_norm", "k_norm.weight": "k_norm"}
        loaded, parts = set(), {}
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.tie:
                continue
            name = name.replace("model.norm.weight", "norm")
            for old, new in renames.items():
                name = name.replace(old, new)
            for shard, (fused, offset) in stacked.items():
                if f".{shard}." in name:
                    target = name.replace(shard, fused)
                    params[target].data[offset:offset + tensor.shape[0]].copy_(tensor)
                    parts.setdefault(target, set()).add(shard)
                    break
            else:
                if name not in params:
                    raise KeyError(f"unexpected weight {name!r}")
                params[name].data.copy_(tensor)
                loaded.add(name)
        for target, got in parts.items():   # a fused param is loaded once all its shards are
            fused = stacked[next(iter(got))][0]
            if got == {s for s, (f, _) in stacked.items() if f == fused}:
                loaded.add(target)
        return loaded

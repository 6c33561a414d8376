"""GPT-2: learned positions, LayerNorm, gelu (tanh), fused c_attn, tied lm_head."""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import InvalidRequestError
from engine.distributed.parallel import TPInfo
from engine.models.config_check import check_gpt2_config
from engine.models.layers import AttentionMetadata, PagedAttention
from engine.models.weights import read_full


class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg.n_embd
        self.num_heads = cfg.n_head
        self.head_dim = h // cfg.n_head
        inner = cfg.n_inner or 4 * h
        self.ln_1 = nn.LayerNorm(h, eps=cfg.layer_norm_epsilon)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=cfg.layer_norm_epsilon)
        self.c_fc = nn.Linear(h, inner)
        self.mlp_proj = nn.Linear(inner, h)
        self.attn = PagedAttention(cfg.n_head, cfg.n_head, self.head_dim, self.head_dim ** -0.5)

    def forward(self, hidden, meta: AttentionMetadata):
        t = hidden.shape[0]
        q, k, v = self.c_attn(self.ln_1(hidden)).chunk(3, dim=-1)
        shape = (t, self.num_heads, self.head_dim)
        attn = self.attn(q.reshape(shape), k.reshape(shape), v.reshape(shape), meta)
        hidden = hidden + self.c_proj(attn.reshape(t, -1))
        mlp = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(hidden)), approximate="tanh"))
        return hidden + mlp


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg, tp: TPInfo = TPInfo()):
        super().__init__()
        check_gpt2_config(cfg)
        if tp.size > 1:
            raise InvalidRequestError(
                f"tensor_parallel_size {tp.size}: gpt2 runs on one GPU only (its layers are "
                f"not sharded); use a Llama/Qwen/Mistral model or tensor_parallel_size 1")
        self.config, self.tp = cfg, tp
        self.ops = None
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def attention_layers(self) -> list[PagedAttention]:
        return [block.attn for block in self.h]

    def forward(self, input_ids, positions, meta: AttentionMetadata,
                logits_indices: torch.Tensor) -> torch.Tensor:
        hidden = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            hidden = block(hidden, meta)
        hidden = self.ln_f(hidden[logits_indices])
        return torch.matmul(hidden, self.wte.weight.t())   # model dtype

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> set[str]:
        """HF tensors or safetensors slices; each shape checked before it is read."""
        params = dict(self.named_parameters())
        loaded = set()
        for hf_name, source in weights:
            name = hf_name.removeprefix("transformer.")
            if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # tied head; causal-mask buffers of old checkpoints
            name = name.replace("attn.c_attn", "c_attn").replace("attn.c_proj", "c_proj")
            name = name.replace("mlp.c_fc", "c_fc").replace("mlp.c_proj", "mlp_proj")
            if name not in params:
                raise KeyError(f"unexpected weight {name!r}")
            shape = tuple(params[name].shape)
            conv1d = name.endswith(".weight") and any(
                k in name for k in ("c_attn", "c_proj", "c_fc", "mlp_proj"))
            if conv1d:   # HF Conv1D stores [in, out]
                params[name].data.copy_(read_full(source, hf_name, shape[::-1]).t())
            else:
                params[name].data.copy_(read_full(source, hf_name, shape))
            loaded.add(name)
        return loaded

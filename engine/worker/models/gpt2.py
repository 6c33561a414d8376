"""GPT-2: learned positions, LayerNorm, gelu (tanh), fused c_attn, tied lm_head.

Tensor parallel as the Llama family: heads (c_attn) and the MLP (c_fc) column-parallel,
c_proj and mlp_proj row-parallel with an all-reduce, the tied wte vocab-parallel."""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.models.parallel import (Segment, Shard, TPInfo, all_reduce, column, gather_vocab,
                                        mark, row, row_bias, split, split_padded,
                                        vocab_embedding)
from engine.worker.models.config_check import check_gpt2_config
from engine.worker.models.layers import AttentionMetadata, PagedAttention
from engine.worker.models.weights import Transposed, load_param


class GPT2Block(nn.Module):
    def __init__(self, cfg, tp: TPInfo):
        super().__init__()
        h = cfg.n_embd
        self.tp, self.head_dim = tp, h // cfg.n_head
        heads = split(cfg.n_head, tp, "the attention heads")
        q = Segment(h, heads.start * self.head_dim, heads.length * self.head_dim)
        inner = split(cfg.n_inner or 4 * h, tp, "n_inner")
        self.num_heads = heads.length
        self.ln_1 = nn.LayerNorm(h, eps=cfg.layer_norm_epsilon)
        self.c_attn = column(nn.Linear(h, 3 * q.length), (q, q, q))
        self.c_proj = row(nn.Linear(q.length, h), q)
        self.ln_2 = nn.LayerNorm(h, eps=cfg.layer_norm_epsilon)
        self.c_fc = column(nn.Linear(h, inner.length), (inner,))
        self.mlp_proj = row(nn.Linear(inner.length, h), inner)
        self.attn = PagedAttention(self.num_heads, self.num_heads, self.head_dim,
                                   self.head_dim ** -0.5)

    def _row(self, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """Row-parallel output: partial sums all-reduced, bias added once (rank 0)."""
        if self.tp.size == 1:
            return linear(x)
        return all_reduce(F.linear(x, linear.weight, row_bias(linear, self.tp)))

    def forward(self, hidden, meta: AttentionMetadata):
        t = hidden.shape[0]
        q, k, v = self.c_attn(self.ln_1(hidden)).chunk(3, dim=-1)
        shape = (t, self.num_heads, self.head_dim)
        attn = self.attn(q.reshape(shape), k.reshape(shape), v.reshape(shape), meta)
        hidden = hidden + self._row(self.c_proj, attn.reshape(t, -1))
        mlp = self._row(self.mlp_proj, F.gelu(self.c_fc(self.ln_2(hidden)), approximate="tanh"))
        return hidden + mlp


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg, tp: TPInfo = TPInfo()):
        super().__init__()
        check_gpt2_config(cfg)
        self.config, self.tp = cfg, tp
        self.ops = None
        vocab = split_padded(cfg.vocab_size, tp)
        self.wte = nn.Embedding(vocab.length, cfg.n_embd)   # tied: also the LM head
        mark(self.wte.weight, Shard(0, (vocab,)))
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg, tp) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def attention_layers(self) -> list[PagedAttention]:
        return [block.attn for block in self.h]

    def forward(self, input_ids, positions, meta: AttentionMetadata,
                logits_indices: torch.Tensor | None) -> torch.Tensor:
        return self.compute_logits(*self.hidden_rows(input_ids, positions, meta, logits_indices))

    def hidden_rows(self, input_ids, positions, meta: AttentionMetadata,
                    logits_indices: torch.Tensor | None) -> tuple[torch.Tensor]:
        """The last block's output at logits_indices, None: every row (see
        LlamaForCausalLM.hidden_rows)."""
        if self.tp.size > 1:
            hidden = vocab_embedding(input_ids, self.wte.weight, self.tp) + self.wpe(positions)
        else:
            hidden = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            hidden = block(hidden, meta)
        return (hidden if logits_indices is None else hidden[logits_indices],)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.ln_f(hidden)
        logits = torch.matmul(hidden, self.wte.weight.t())   # model dtype
        if self.tp.size > 1:
            logits = gather_vocab(logits, self.tp, self.config.vocab_size)
        return logits

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
            conv1d = name.endswith(".weight") and any(
                k in name for k in ("c_attn", "c_proj", "c_fc", "mlp_proj"))
            load_param(params[name], Transposed(source) if conv1d else source, hf_name)
            loaded.add(name)
        return loaded

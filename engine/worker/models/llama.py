"""The Llama family (Llama, Qwen2 with qkv bias, Qwen3 with q/k norm, Mistral, SmolLM).

Runs a flattened batch of tokens from many requests against the paged KV cache.
q/k/v and gate/up projections are fused into single matmuls; weights load from HF names.
Tensor parallel (TPInfo.size > 1): heads and the MLP split over ranks (Megatron layout),
two all-reduces per layer, vocab-parallel embedding and LM head; at size 1 the forward is
the single-GPU one (no collective is called).
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from engine.worker.models.parallel import (Segment, Shard, TPInfo, all_reduce, column, gather_vocab,
                                        kv_head_segment, mark, row, row_bias, split,
                                        split_padded, vocab_embedding)
from engine.worker.models.config_check import check_llama_config
from engine.worker.models.layers import (AttentionMetadata, PagedAttention, rope_cos_sin_cache,
                                  rope_inv_freq)
from engine.worker.models.weights import load_param


def layer_segments(cfg, tp: TPInfo) -> tuple[Segment, Segment, Segment]:
    """This rank's rows of q, of k (and v), of gate (and up); refuses sizes that N does
    not divide (checked before any worker starts: loader.check_tensor_parallel)."""
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    q_seg = split(cfg.num_attention_heads, tp, "the attention heads")
    return (Segment(q_seg.full * d, q_seg.start * d, q_seg.length * d),
            kv_head_segment(kv_heads, d, tp),
            split(cfg.intermediate_size, tp, "intermediate_size"))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, model):
        super().__init__()
        object.__setattr__(self, "model", model)  # ops / rope cache / tp; not a submodule
        tp, h, d = model.tp, cfg.hidden_size, model.head_dim
        q_seg, kv_seg, inter = layer_segments(cfg, tp)
        self.num_heads, self.num_kv_heads, self.head_dim = (q_seg.length // d,
                                                            kv_seg.length // d, d)
        self.q_size, self.kv_size = q_seg.length, kv_seg.length
        bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
        # column-parallel q|k|v and gate|up, row-parallel o and down (all-reduced after)
        self.qkv_proj = column(nn.Linear(h, self.q_size + 2 * self.kv_size, bias=bias),
                               (q_seg, kv_seg, kv_seg))
        self.o_proj = row(nn.Linear(self.q_size, h,
                                    bias=bool(getattr(cfg, "attention_bias", False))), q_seg)
        mlp_bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_up_proj = column(nn.Linear(h, 2 * inter.length, bias=mlp_bias), (inter, inter))
        self.down_proj = row(nn.Linear(inter.length, h, bias=mlp_bias), inter)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(d))
            self.k_norm = nn.Parameter(torch.ones(d))
            # q_norm for each query head, then k_norm for each key head: the per-head norms
            # of q and k run as one rms_norm over the qkv output's first H + H_kv heads
            # (float32 like the rope table; set from the two by load_weights)
            self.register_buffer("qk_norm_rows", torch.ones(self.num_heads + self.num_kv_heads,
                                                            d), persistent=False)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d ** -0.5)

    def forward(self, positions, hidden, residual, meta: AttentionMetadata):
        ops, eps, tp = self.model.ops, self.model.eps, self.model.tp
        fused = getattr(ops, "llama_decode_layer", None)      # the native CPU backend's
        if (fused is not None and tp.size == 1 and not self.qk_norm
                and meta.query_start_loc is None and meta.num_decode_tokens == hidden.shape[0]):
            done = fused(self, positions, hidden, residual, meta, self.model.cos_sin_cache, eps)
            if done is not None:
                return done
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
        t, heads = hidden.shape[0], self.num_heads
        if self.qk_norm:        # q's and k's heads normed in one launch
            qk = qkv[:, :self.q_size + self.kv_size].view(t, heads + self.num_kv_heads,
                                                          self.head_dim)
            qk = ops.rms_norm(qk, self.qk_norm_rows, eps)
            q, k = qk[:, :heads], qk[:, heads:]
        else:
            q = q.reshape(t, heads, self.head_dim)
            k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        attn = self._attention(positions, q, k, v, meta)
        hidden = ops.linear(attn.reshape(t, self.q_size), self.o_proj.weight,
                            row_bias(self.o_proj, tp))
        if tp.size > 1:
            hidden = all_reduce(hidden)
        gate_up, residual = ops.rms_norm_linear(hidden, self.post_attention_layernorm, eps,
                                                self.gate_up_proj.weight,
                                                self.gate_up_proj.bias, residual)
        hidden = ops.silu_mul_linear(gate_up, self.down_proj.weight,
                                     row_bias(self.down_proj, tp))
        if tp.size > 1:
            hidden = all_reduce(hidden)
        return hidden, residual

    def _attention(self, positions, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        """Rotary, this step's K/V into the paged cache, attention: one launch for a
        decode-only step (ops.rotary_decode_attention; a verify step's rows of one
        sequence see each other's K/V: rows_shared), else rotary_store_kv then the
        attention (which skips its own store)."""
        ops, attn, cos_sin = self.model.ops, self.attn, self.model.cos_sin_cache
        if attn.calibrating:        # the scales come from the rotated keys, then the store
            q, k = ops.rotary_embedding(positions, q, k, cos_sin, True)
            return attn(q, k, v, meta)
        if meta.query_start_loc is None and meta.num_decode_tokens == q.shape[0]:
            return ops.rotary_decode_attention(
                positions, q, k, v, cos_sin, True, attn.k_cache, attn.v_cache,
                meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens,
                attn.scale, rows_shared=meta.decode_rows_shared, **attn.kv_scales,
                **meta.order_kwargs(ops))
        q = ops.rotary_store_kv(positions, q, k, v, cos_sin, True, attn.k_cache,
                                attn.v_cache, meta.slot_mapping, **attn.kv_scales)
        return attn(q, k, v, meta, kv_stored=True)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg, tp: TPInfo = TPInfo()):
        super().__init__()
        check_llama_config(cfg)
        self.config, self.tp = cfg, tp
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.ops = None
        vocab = split_padded(cfg.vocab_size, tp)
        self.embed_tokens = nn.Embedding(vocab.length, cfg.hidden_size)
        mark(self.embed_tokens.weight, Shard(0, (vocab,)))
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, self) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.tie = bool(getattr(cfg, "tie_word_embeddings", False))
        self.lm_head = None
        if not self.tie:
            self.lm_head = column(nn.Linear(cfg.hidden_size, vocab.length, bias=False), (vocab,))
        inv_freq, scaling = rope_inv_freq(cfg, self.head_dim)
        self.register_buffer("cos_sin_cache", rope_cos_sin_cache(
            inv_freq, cfg.max_position_embeddings, scaling), persistent=False)

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.attn for layer in self.layers]

    def forward(self, input_ids, positions, meta: AttentionMetadata,
                logits_indices: torch.Tensor | None) -> torch.Tensor:
        return self.compute_logits(*self.hidden_rows(input_ids, positions, meta, logits_indices))

    def hidden_rows(self, input_ids, positions, meta: AttentionMetadata,
                    logits_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's (hidden, residual) at logits_indices, None: every row (a
        decode-only step, whose rows all sample: no gather kernels). What compute_logits
        needs (a mixed-step CUDA graph captures this part, engine/worker/cuda_graphs.py)."""
        if self.tp.size > 1:
            hidden, residual = vocab_embedding(input_ids, self.embed_tokens.weight, self.tp), None
        else:
            hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        if logits_indices is None:
            return hidden, residual
        return hidden[logits_indices], residual[logits_indices]

    def compute_logits(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.tie else self.lm_head.weight
        logits, _ = self.ops.rms_norm_linear(hidden, self.norm, self.eps, weight, None, residual)
        if self.tp.size > 1:   # every rank's vocab slice, gathered (sampling sees [S, V])
            logits = gather_vocab(logits, self.tp, self.config.vocab_size)
        return logits   # model dtype: argmax needs no upcast

    # -- weights ---------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, object]]) -> set[str]:
        """Copy HF-named tensors (or safetensors slices: only this rank's rows are read)
        into this model; returns the names of filled params. Shapes are checked first."""
        params = dict(self.named_parameters())
        stacked = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1),
                   "v_proj": ("qkv_proj", 2), "gate_proj": ("gate_up_proj", 0),
                   "up_proj": ("gate_up_proj", 1)}
        renames = {"self_attn.": "", "mlp.": "", "model.": "",
                   "input_layernorm.weight": "input_layernorm",
                   "post_attention_layernorm.weight": "post_attention_layernorm",
                   "q_norm.weight": "q_norm", "k_norm.weight": "k_norm"}
        loaded, parts = set(), {}
        for hf_name, source in weights:
            if "rotary_emb" in hf_name or (hf_name == "lm_head.weight" and self.tie):
                continue
            name = hf_name.replace("model.norm.weight", "norm")
            for old, new in renames.items():
                name = name.replace(old, new)
            for part, (fused, index) in stacked.items():
                if f".{part}." in name:
                    target = name.replace(part, fused)
                    if target not in params:
                        raise KeyError(f"unexpected weight {hf_name!r}")
                    load_param(params[target], source, hf_name, index)
                    parts.setdefault(target, set()).add(part)
                    break
            else:
                if name not in params:
                    raise KeyError(f"unexpected weight {hf_name!r}")
                load_param(params[name], source, hf_name)
                loaded.add(name)
        for target, got in parts.items():   # a fused param is loaded once all its parts are
            fused = stacked[next(iter(got))][0]
            if got == {s for s, (f, _) in stacked.items() if f == fused}:
                loaded.add(target)
        for layer in self.layers:
            if layer.qk_norm:
                layer.qk_norm_rows.copy_(torch.cat((
                    layer.q_norm.expand(layer.num_heads, -1),
                    layer.k_norm.expand(layer.num_kv_heads, -1))))
        return loaded

"""Which slice of each weight a rank holds (in one process, no group needed): heads and MLP
split, KV heads replicated past their count, the vocab padded, dummy weights equal to the
TP=1 slices; sizes N cannot split are refused by name."""
from __future__ import annotations

import functools

import pytest
import torch

from engine.config import InvalidRequestError
from engine.worker.models.parallel import TPInfo
from engine.worker.models.llama import LlamaForCausalLM
from engine.worker.models.loader import _init_dummy, check_tensor_parallel, model_config

D, Q, KV = 8, 64, 16


@functools.cache
def _cfg():
    """8 q heads of 8 dims, 2 KV heads, vocab 321 (padded to 322 at N=2, 324 at N=4).
    Built at first use: transformers' config classes cost seconds to import, and every
    xdist worker collects this module, most never running it."""
    from transformers import AutoConfig
    return AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=96,
                                num_hidden_layers=1, num_attention_heads=8,
                                num_key_value_heads=2, vocab_size=321,
                                max_position_embeddings=64, tie_word_embeddings=False)


def _dummy(tp: TPInfo) -> LlamaForCausalLM:
    model = LlamaForCausalLM(_cfg(), tp)
    _init_dummy(model, seed=5)
    return model


@pytest.mark.parametrize("size", [2, 4])
def test_rank_slices_are_the_tp1_rows(size):
    full = _dummy(TPInfo())
    fl = full.layers[0]
    q, k, v = fl.qkv_proj.weight.split([Q, KV, KV])
    qb, kb, vb = fl.qkv_proj.bias.split([Q, KV, KV])
    for rank in range(size):
        part = _dummy(TPInfo(rank, size))
        pl = part.layers[0]
        heads = 8 // size
        kv_head = rank * 2 // size          # N=4: ranks 0,1 hold head 0; ranks 2,3 head 1
        kv_rows = slice(kv_head * D, (kv_head + 1) * D)
        q_rows = slice(rank * heads * D, (rank + 1) * heads * D)
        assert (pl.num_heads, pl.num_kv_heads) == (heads, 1)
        torch.testing.assert_close(pl.qkv_proj.weight,
                                   torch.cat((q[q_rows], k[kv_rows], v[kv_rows])), rtol=0, atol=0)
        torch.testing.assert_close(pl.qkv_proj.bias,
                                   torch.cat((qb[q_rows], kb[kv_rows], vb[kv_rows])), rtol=0, atol=0)
        cols = slice(rank * Q // size, (rank + 1) * Q // size)
        torch.testing.assert_close(pl.o_proj.weight, fl.o_proj.weight[:, cols], rtol=0, atol=0)
        inter = slice(rank * 96 // size, (rank + 1) * 96 // size)
        gate, up = fl.gate_up_proj.weight.split([96, 96])
        torch.testing.assert_close(pl.gate_up_proj.weight, torch.cat((gate[inter], up[inter])),
                                   rtol=0, atol=0)
        torch.testing.assert_close(pl.down_proj.weight, fl.down_proj.weight[:, inter],
                                   rtol=0, atol=0)
    # vocab: every rank's rows, concatenated, are the TP=1 head plus zero padding
    parts = [_dummy(TPInfo(r, size)).lm_head.weight for r in range(size)]
    rows = torch.cat(parts)
    assert rows.shape[0] == -(-321 // size) * size
    torch.testing.assert_close(rows[:321], full.lm_head.weight, rtol=0, atol=0)
    assert not rows[321:].any()


@pytest.mark.parametrize("name, size, match", [
    ("dummy:tiny", 3, r"tensor_parallel_size 3 does not divide the attention heads \(4\)"),
    ("dummy:qwen2.5-7b", 8, r"does not divide the attention heads \(28\)"),
    ("dummy:tiny-gpt2", 3, r"tensor_parallel_size 3 does not divide the attention heads \(4\)"),
])
def test_unsplittable_sizes_are_refused(name, size, match):
    with pytest.raises(InvalidRequestError, match=match):
        check_tensor_parallel(model_config(name), size)


def test_kv_heads_not_dividing_ranks_are_refused():
    from transformers import AutoConfig
    cfg = AutoConfig.for_model("llama", hidden_size=48, intermediate_size=96,
                               num_hidden_layers=1, num_attention_heads=6,
                               num_key_value_heads=2, vocab_size=64)
    with pytest.raises(InvalidRequestError, match=r"exceeds the KV heads \(2\) and is not a "
                                                  r"multiple"):
        check_tensor_parallel(cfg, 3)
    check_tensor_parallel(cfg, 2)   # 3 heads + 1 KV head per rank: accepted


@pytest.mark.parametrize("preset, params", [("llama-3.1-8b", 8.03e9), ("qwen2.5-7b", 7.62e9)])
def test_real_8b_presets_have_real_shapes(preset, params):
    """Counted on the meta device at TP=1 and per rank at TP=2 (half, but the norms)."""
    cfg = model_config(f"dummy:{preset}")
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1e4}   # meta: no rope table
    with torch.device("meta"):
        full = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
        half = sum(p.numel() for p in LlamaForCausalLM(cfg, TPInfo(1, 2)).parameters())
    assert abs(full - params) / params < 0.005
    assert abs(half - full / 2) / full < 0.001

"""Checkpoints read as data from a stranger (issue 17, engine/worker/models): every tensor's shape
is checked against the full expected shape before it is read or sliced (a broadcastable
wrong shape is refused, not loaded as garbage), config sizes are checked by field name,
a damaged tokenizer or index is refused; a sharded index checkpoint loads."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from tests.hf_models import make_checkpoint
from tests.helpers import GREEDY, refused
from tests.engine.worker.distributed.tp_helpers import shard_checkpoint


def _copy(ckpt, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt, dst)
    return dst


def _edit_tensor(path, name, value):
    from safetensors.torch import load_file, save_file
    tensors = load_file(path / "model.safetensors")
    tensors[name] = value
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("name, shape, expected", [
    ("model.embed_tokens.weight", (1, 64), r"\[320, 64\]"),
    ("model.layers.0.self_attn.q_proj.weight", (1, 64), r"\[64, 64\]"),
    ("model.layers.1.self_attn.k_proj.weight", (64, 64), r"\[32, 64\]"),
    ("model.layers.0.mlp.down_proj.weight", (64, 1), r"\[64, 128\]"),
    ("lm_head.weight", (320, 1), r"\[320, 64\]"),
])
def test_broadcastable_wrong_shapes_are_refused(ckpt, tmp_path, name, shape, expected):
    path = _copy(ckpt, tmp_path)
    _edit_tensor(path, name, torch.ones(shape))
    got = re.escape(str(list(shape)))
    refused(rf"unreadable weights in .*tensor '{name}' has shape {got}, expected {expected}",
            LLM, model=str(path), device="cpu")


@pytest.mark.parametrize("changes, match", [
    (dict(num_key_value_heads=0), r"num_key_value_heads must be an integer >= 1, got 0"),
    (dict(num_key_value_heads=3), r"num_key_value_heads \(3\) must divide num_attention_heads"),
    (dict(max_position_embeddings=10 ** 12), r"max_position_embeddings must be an integer in"),
    (dict(max_position_embeddings=-5), r"max_position_embeddings must be an integer in"),
    (dict(max_position_embeddings=0), r"max_position_embeddings must be an integer in"),
    (dict(rope_scaling={"rope_type": "warp-drive", "factor": 2.0}),
     r"config field rope_type: unsupported rope type 'warp-drive'; supported: default, "),
    (dict(rope_parameters={"rope_type": "warp-drive", "rope_theta": 1e4}),
     r"config field rope_type: unsupported rope type 'warp-drive'"),
    (dict(hidden_size=0), r"config field hidden_size must be an integer >= 1, got 0"),
])
def test_bad_config_fields_are_refused_by_name(ckpt, tmp_path, changes, match):
    path = _copy(ckpt, tmp_path)
    _edit_config(path, **changes)
    refused(match, LLM, model=str(path), device="cpu")


def test_garbage_tokenizer_is_refused(ckpt, tmp_path):
    path = _copy(ckpt, tmp_path)
    (path / "tokenizer.json").write_text("{ not a tokenizer")
    refused(r"unreadable tokenizer in .*tokenizer\.json", LLM, model=str(path), device="cpu")


def test_sharded_index_checkpoint_loads_and_generates_the_same(ckpt, tmp_path):
    path = _copy(ckpt, tmp_path)
    shard_checkpoint(path, num_files=3)
    kw, sp = dict(device="cpu", dtype="float32"), SamplingParams(max_tokens=6, **GREEDY)
    prompt = [[5, 9, 2, 7, 1, 3, 8, 4, 6, 11, 13, 12, 10, 14, 15, 16, 17, 18]]
    assert LLM(model=str(path), **kw).generate(prompt, sp)[0].outputs[0].token_ids == \
        LLM(model=str(ckpt), **kw).generate(prompt, sp)[0].outputs[0].token_ids


@pytest.mark.parametrize("damage, match", [
    ("missing_file", r"is partial: its index names missing files, e\.g\. \['model-00002"),
    ("garbage_index", r"unreadable .*model\.safetensors\.index\.json: needs a weight_map"),
])
def test_damaged_index_is_refused(ckpt, tmp_path, damage, match):
    path = _copy(ckpt, tmp_path)
    shard_checkpoint(path)
    if damage == "missing_file":
        (path / "model-00002-of-00002.safetensors").unlink()
    else:
        (path / "model.safetensors.index.json").write_text('{"weight_map": 7}')
    refused(match, LLM, model=str(path), device="cpu")

"""Engine arguments, model names and presets, and broken checkpoints (garbage config, no
weights, truncated or partial safetensors) are refused with a clear InvalidRequestError."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from tests.hf_models import make_checkpoint
from tests.helpers import GREEDY, refused


# -- engine arguments, model names, checkpoints ---------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(model="no-such-model"), r"unknown model 'no-such-model'.*dummy:<preset>"),
    (dict(model="dummy:nope"), r"unknown dummy preset 'nope'; presets: .*tiny"),
    (dict(model="dummy:"), r"unknown dummy preset ''"),
    (dict(model=""), r"model must be a non-empty string"),
    (dict(model="dummy:tiny", foo=1), r"unknown engine argument\(s\): foo"),
    (dict(model="dummy:tiny", block_size=0), r"block_size must be an integer >= 1, got 0"),
    (dict(model="dummy:tiny", block_size=2.5), r"block_size must be an integer >= 1"),
    (dict(model="dummy:tiny", num_blocks=1), r"num_blocks must be an integer >= 2, got 1"),
    (dict(model="dummy:tiny", num_blocks="8"), r"num_blocks must be an integer >= 2"),
    (dict(model="dummy:tiny", device="tpu"), r"device must be one of auto, cpu, cuda, got 'tpu'"),
    (dict(model="dummy:tiny", dtype="int8"), r"dtype must be one of .*got 'int8'"),
    (dict(model="dummy:tiny", attention_backend="flash"), r"attention_backend must be one of"),
    (dict(model="dummy:tiny", gpu_memory_utilization=0), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(model="dummy:tiny", gpu_memory_utilization="a"), r"gpu_memory_utilization must be"),
    (dict(model="dummy:tiny", max_model_len=0), r"max_model_len must be"),
    (dict(model="dummy:tiny", max_model_len="a"), r"max_model_len must be"),
    (dict(model="dummy:tiny", max_num_batched_tokens=0), r"max_num_batched_tokens must be an integer in \[1, \d+\]"),
    (dict(model="dummy:tiny", max_num_seqs=-1), r"max_num_seqs must be an integer in \[1, \d+\]"),
    (dict(model="dummy:tiny", enable_prefix_caching="yes"), r"enable_prefix_caching must be a bool"),
], ids=lambda v: repr(v)[:60])
def test_bad_engine_arguments_are_refused(kwargs, match):
    refused(match, LLM, **{"device": "cpu", **kwargs})


def test_unknown_hub_id_offline(monkeypatch):
    """A hub id that cannot be fetched (offline here) is refused with the hub's reason."""
    import huggingface_hub.constants as hub
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    refused(r"cannot fetch model 'no-such-org/no-such-model' from the hub", LLM,
            model="no-such-org/no-such-model", device="cpu")


def test_missing_path_and_file_path(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    refused(r"is not a directory", LLM, model=str(f), device="cpu")
    refused(r"unknown model .*not a directory", LLM, model=str(tmp_path / "nope"), device="cpu")


def _copy(ckpt, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(ckpt, dst)
    return dst


def _edit_tensors(path, edit):
    from safetensors.torch import load_file, save_file
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.mark.parametrize("damage, match", [
    ("no_config", r"has no config\.json: not an HF checkpoint"),
    ("garbage_config", r"unreadable config in"),
    ("empty_config", r"unreadable config in"),
    ("bert_config", r"unsupported architecture 'bert'; supported: .*llama"),
    ("no_weights", r"no \*\.safetensors weights in"),
    ("truncated", r"unreadable weights in"),
    ("garbage_weights", r"unreadable weights in"),
    ("empty_weights", r"unreadable weights in"),
    ("missing_norm", r"is partial: 1 missing tensors, e\.g\. \['norm'\]"),
    ("missing_layer", r"is partial: \d+ missing tensors"),
    ("missing_k_proj", r"is partial: 1 missing tensors, e\.g\. \['layers\.1\.qkv_proj"),
    ("missing_up_proj", r"is partial: 1 missing tensors, e\.g\. \['layers\.0\.gate_up_proj"),
    ("wrong_shape", r"unreadable weights in"),
    ("unexpected_tensor", r"unreadable weights in .*unexpected weight"),
])
def test_broken_checkpoints_are_refused(ckpt, tmp_path, damage, match):
    path = _copy(ckpt, tmp_path, damage)
    weights = path / "model.safetensors"
    cfg = path / "config.json"
    if damage == "no_config":
        cfg.unlink()
    elif damage == "garbage_config":
        cfg.write_text("{ this is not json")
    elif damage == "empty_config":
        cfg.write_text("")
    elif damage == "bert_config":
        cfg.write_text(json.dumps({"model_type": "bert"}))
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[:len(data) // 2])
    elif damage == "garbage_weights":
        weights.write_bytes(os.urandom(4096))
    elif damage == "empty_weights":
        weights.write_bytes(b"")
    elif damage == "missing_norm":
        _edit_tensors(path, lambda t: t.pop("model.norm.weight"))
    elif damage == "missing_layer":
        _edit_tensors(path, lambda t: [t.pop(k) for k in list(t) if ".layers.1." in k])
    elif damage == "missing_k_proj":
        _edit_tensors(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    elif damage == "missing_up_proj":
        _edit_tensors(path, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    elif damage == "wrong_shape":
        _edit_tensors(path, lambda t: t.update({"model.norm.weight": torch.ones(7)}))
    elif damage == "unexpected_tensor":
        _edit_tensors(path, lambda t: t.update({"model.extra.weight": torch.ones(3)}))
    refused(match, LLM, model=str(path), device="cpu")


def test_sharded_checkpoint_loads(ckpt, tmp_path):
    """Fused params whose shards sit in different files are complete, not 'partial'."""
    from safetensors.torch import load_file, save_file
    path = _copy(ckpt, tmp_path, "sharded")
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    first = {k: v for k, v in tensors.items() if "k_proj" in k or "up_proj" in k}
    rest = {k: v for k, v in tensors.items() if k not in first}
    save_file(first, path / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(rest, path / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    kw = dict(device="cpu", dtype="float32")
    sp = SamplingParams(max_tokens=4, **GREEDY)
    assert LLM(model=str(path), **kw).generate([[1, 2, 3]], sp)[0].outputs[0].token_ids == \
        LLM(model=str(ckpt), **kw).generate([[1, 2, 3]], sp)[0].outputs[0].token_ids


def test_intact_copy_still_loads(ckpt, tmp_path):
    path = _copy(ckpt, tmp_path, "ok")
    out = LLM(model=str(path), device="cpu").generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2

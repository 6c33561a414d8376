"""Load a model: HF checkpoint directory or hub id, the bundled default, or dummy:<preset>.

Configs come from transformers (the bundled model's from its config.json alone, a dummy
preset's from presets.py: no transformers import, seconds saved on a small CPU; presets
with llama3 rope scaling excepted), weights from safetensors, the
tokenizer from engine/tokenizer.py when the checkpoint has one. Dummy presets build the
real architecture with random weights (like vLLM's load_format="dummy").
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from engine.config import DEFAULT_DRAFT_MODEL, InvalidRequestError
from engine.generation_config import GENERATION_CONFIG_FILE, sampling_defaults
from engine.config_json import json_object
from engine.request import SamplingParams
from engine.worker.models.parallel import TPInfo, split, take
from engine.worker.models.gpt2 import GPT2LMHeadModel
from engine.worker.models.config_check import (ConfigFiles, check_gpt2_config,
                                               check_llama_config, context_length)
from engine.worker.models.llama import LlamaForCausalLM, layer_segments
from engine.worker.models.presets import PRESETS, preset_config
from engine.tokenizer import DEFAULT_MODEL_DIR, load_tokenizer_dir, resolve_model_path  # noqa: F401

ARCHITECTURES = {
    "llama": LlamaForCausalLM, "qwen2": LlamaForCausalLM, "qwen3": LlamaForCausalLM,
    "mistral": LlamaForCausalLM, "gpt2": GPT2LMHeadModel,
}


@dataclass
class LoadedModel:
    model: nn.Module
    hf_config: object
    tokenizer: object | None
    name: str
    eos_token_ids: tuple[int, ...]
    max_model_len: int


def load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0,
               tp: TPInfo = TPInfo(), files: ConfigFiles | None = None) -> LoadedModel:
    """This rank's model (its shard of every weight when tp.size > 1). `files`: what the
    start read of the checkpoint's configs already (engine/worker/executor/setup.py)."""
    files = files or ConfigFiles()
    _check_name(name)
    if name.startswith("dummy:"):
        hf_config = preset_config(name.removeprefix("dummy:"))
        model = _build(hf_config, device, dtype, tp)
        _init_dummy(model, seed)
        return LoadedModel(model, hf_config, None, name, _eos_ids(hf_config, None),
                           context_length(hf_config)[1])
    path = _local_dir(resolve_model_path(name))
    hf_config = _read_config(path, files)
    model = _build(hf_config, device, dtype, tp)
    _load_safetensors(model, path)
    tokenizer = load_tokenizer_dir(path)
    return LoadedModel(model, hf_config, tokenizer, name, _eos_ids(hf_config, path, files),
                       context_length(hf_config)[1])


def model_config(name: str):
    """The HF config of a model name (no weights read): a preset's or the checkpoint's."""
    _check_name(name)
    if name.startswith("dummy:"):
        return preset_config(name.removeprefix("dummy:"))
    return _read_config(_local_dir(resolve_model_path(name)))


def _check_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"model must be a non-empty string, got {name!r}")


def check_tensor_parallel(hf_config, size: int) -> None:
    """Refuse a tensor_parallel_size the model cannot be split over, before any rank starts."""
    if size == 1:
        return
    tp = TPInfo(0, size)
    if hf_config.model_type == "gpt2":
        check_gpt2_config(hf_config)
        split(hf_config.n_head, tp, "the attention heads")
        split(hf_config.n_inner or 4 * hf_config.n_embd, tp, "n_inner")
        return
    check_llama_config(hf_config)
    layer_segments(hf_config, tp)


def _local_dir(name: str) -> str:
    if os.path.isdir(name):
        return name
    if os.path.exists(name):
        raise InvalidRequestError(f"model path {name!r} is not a directory")
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise InvalidRequestError(
            f"unknown model {name!r}: not a directory, a hub id (org/name), 'default', "
            f"or dummy:<preset> (presets: {', '.join(sorted(PRESETS))})")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model",
                                                       "*.txt"])
    except Exception as exc:  # no network, unknown repo, auth...
        raise InvalidRequestError(f"cannot fetch model {name!r} from the hub: {exc}") from exc


def _read_config(path: str, files: ConfigFiles | None = None):
    """The checkpoint's config: its config.json's object, as transformers' AutoConfig
    builds it from the dict it reads (the file read once per start: `files`)."""
    file = os.path.join(path, "config.json")
    if not os.path.exists(file):
        raise InvalidRequestError(f"{path} has no config.json: not an HF checkpoint")
    if Path(path).resolve() in (DEFAULT_MODEL_DIR, Path(DEFAULT_DRAFT_MODEL)):
        return bundled_config(Path(path).resolve(), files)
    from transformers import CONFIG_MAPPING
    try:
        fields = json.loads((files or ConfigFiles()).text(file))
        if not isinstance(fields, dict):
            raise ValueError(f"config.json holds a {type(fields).__name__}, not an object")
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"unreadable config in {path}: {exc}") from exc
    model_type = fields.get("model_type")
    if model_type not in ARCHITECTURES:
        raise InvalidRequestError(f"unsupported architecture {model_type!r}; supported: "
                                  f"{', '.join(sorted(ARCHITECTURES))}")
    try:
        cfg = CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as exc:
        raise InvalidRequestError(f"unreadable config in {path}: {exc}") from exc
    cfg._name_or_path = path
    return cfg


def _build(hf_config, device: torch.device, dtype: torch.dtype, tp: TPInfo) -> nn.Module:
    with torch.device(device):
        model = ARCHITECTURES[hf_config.model_type](hf_config, tp)
    return _keep_fp32_buffers(model, dtype)


def _keep_fp32_buffers(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast parameters to dtype; buffers (the rope table) stay float32."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    for name, buf in buffers.items():
        module = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        setattr(module, name.rpartition(".")[2], buf)
    return model


def _weight_files(path: str) -> list[str]:
    """The checkpoint's files: those its model.safetensors.index.json names, else *.safetensors."""
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise InvalidRequestError(f"no *.safetensors weights in {path}")
        return files
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
        assert names and all(isinstance(n, str) and os.sep not in n for n in names)
    except Exception as exc:
        raise InvalidRequestError(f"unreadable {index}: needs a weight_map of tensor name -> "
                                  f"file name ({type(exc).__name__}: {exc})") from exc
    missing = [n for n in names if not os.path.exists(os.path.join(path, n))]
    if missing:
        raise InvalidRequestError(f"checkpoint {path} is partial: its index names missing "
                                  f"files, e.g. {missing[:3]}")
    return [os.path.join(path, n) for n in names]


def _load_safetensors(model: nn.Module, path: str) -> None:
    from safetensors import safe_open
    files = _weight_files(path)
    expected = {n for n, _ in model.named_parameters()}
    try:
        def tensors():   # one stream over all files: a fused param may span two of them
            for file in files:   # slices: each rank reads only its rows of a tensor
                with safe_open(file, framework="pt", device="cpu") as f:
                    yield from ((k, f.get_slice(k)) for k in f.keys())
        loaded = model.load_weights(tensors())
    except Exception as exc:
        raise InvalidRequestError(f"unreadable weights in {path}: {exc}") from exc
    missing = expected - loaded
    if missing:
        raise InvalidRequestError(f"checkpoint {path} is partial: {len(missing)} missing "
                                  f"tensors, e.g. {sorted(missing)[:3]}")


def _init_dummy(model: nn.Module, seed: int) -> None:
    """Random N(0, 0.02) weights, unit norms, zero norm biases; seeded, made on the device.
    Under TP each rank draws every full (TP=1) tensor in the same order and keeps its
    slice, so a rank's shard equals that slice of the TP=1 weights (TP=N greedy == TP=1);
    the cost is the TP=1 generation time on every rank, one full tensor at a time."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name or ".ln_" in name or name.startswith("ln_"):
            p.data.fill_(0.0 if name.endswith("bias") else 1.0)
            continue
        shard = getattr(p, "tp_shard", None)
        shape = shard.full_shape(p.shape) if shard else p.shape
        full = torch.empty(shape, dtype=torch.float32, device=device).normal_(
            0.0, 0.02, generator=gen)
        p.data.copy_(full if tuple(shape) == tuple(p.shape) else take(full, shard))


def bundled_config(path: Path = DEFAULT_MODEL_DIR,
                   files: ConfigFiles | None = None) -> SimpleNamespace:
    """The bundled model's (or its bundled draft's) config.json as attributes: it sets
    every field the Llama code reads (tests/engine/ipc/test_startup.py checks them
    against AutoConfig's)."""
    return SimpleNamespace(**json.loads((files or ConfigFiles()).text(
        str(path / "config.json"))))


def _eos_ids(hf_config, path: str | None, files: ConfigFiles | None = None) -> tuple[int, ...]:
    ids = getattr(hf_config, "eos_token_id", None)
    if path and os.path.exists(os.path.join(path, GENERATION_CONFIG_FILE)):
        try:   # the file's eos_token_id, as GenerationConfig reads it
            ids = _json_object(os.path.join(path, GENERATION_CONFIG_FILE), files).get(
                "eos_token_id") or ids
        except InvalidRequestError:
            pass
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)


def _json_object(file: str, files: ConfigFiles | None = None) -> dict:
    """A JSON file holding an object; InvalidRequestError naming the file otherwise."""
    try:
        text = (files or ConfigFiles()).text(file)
    except OSError as exc:
        raise InvalidRequestError(f"unreadable {file}: {exc}") from exc
    return json_object(text, file)


def default_sampling_params(model: str, generation_config: str = "auto",
                            override: dict | None = None,
                            files: ConfigFiles | None = None) -> dict:
    """The sampling defaults a model's generation config sets, as vLLM's
    ModelConfig.get_diff_sampling_param: the fields of GENERATION_SAMPLING_FIELDS that
    hold a value, max_new_tokens as max_tokens. generation_config (EngineConfig's, vLLM's
    --generation-config): auto reads the model's generation_config.json, else the same
    fields of its config.json (transformers' GenerationConfig.from_model_config), a dummy
    preset none; vllm reads nothing; a folder reads its generation_config.json.
    `override` (--override-generation-config) is set over what was read (a None takes a
    field out). The values are checked as SamplingParams checks them: a bad file is
    refused as the engine starts, before the model loads
    (engine/worker/executor/setup.py)."""
    file = _generation_file(model, generation_config)
    found = sampling_defaults({**(_json_object(file, files) if file else {}),
                               **(override or {})})
    try:
        SamplingParams(**found)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{file}: {exc} (--generation-config vllm leaves the "
                                  f"model's generation config out)") from None
    return found


def _generation_file(model: str, generation_config: str) -> str | None:
    """The file the defaults come from (None: no file)."""
    _check_name(model)
    if generation_config == "vllm":
        return None
    if generation_config != "auto":       # a folder (EngineConfig checked it has the file)
        return os.path.join(generation_config, GENERATION_CONFIG_FILE)
    if model.startswith("dummy:"):
        return None
    path = _local_dir(resolve_model_path(model))
    for name in (GENERATION_CONFIG_FILE, "config.json"):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    return None

"""Dummy presets (engine/worker/models/presets.py) are built without transformers, and
equal AutoConfig.for_model on every field the engine reads."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.worker.models.presets import PRESETS, preset_config, preset_hf_config

# what the model code, the loader and the TP check read of a config (test_every_field_
# read_is_compared fails when the code starts reading another one)
FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
          "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
          "tie_word_embeddings", "eos_token_id", "rope_parameters", "partial_rotary_factor",
          "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "layer_norm_epsilon")
MISSING = object()


class Spy:
    """A config that records each attribute read."""

    def __init__(self, cfg):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._cfg, name)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_equals_autoconfig_on_every_field_the_engine_reads(name):
    from engine.worker.models.layers import rope_inv_freq
    from engine.worker.models.loader import _eos_ids
    plain, hf = preset_config(name), preset_hf_config(name)
    for field in FIELDS:
        assert getattr(plain, field, MISSING) == getattr(hf, field, MISSING), field
    if plain.model_type != "gpt2":
        a, b = rope_inv_freq(plain, plain.head_dim if hasattr(plain, "head_dim") else
                             plain.hidden_size // plain.num_attention_heads), \
            rope_inv_freq(hf, getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads))
        assert a[1] == b[1] and a[0].tolist() == b[0].tolist()
    assert _eos_ids(plain, None) == _eos_ids(hf, None)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2", "qwen2.5-0.5b", "qwen3-0.6b"])
def test_every_field_read_is_compared(name):
    """Building the model (on the meta device: no weights), its EOS ids and the TP check
    read only FIELDS."""
    from engine.config import InvalidRequestError
    from engine.worker.models import loader
    from engine.worker.models.parallel import TPInfo
    spy = Spy(preset_config(name))
    loader._build(spy, torch.device("meta"), torch.float32, TPInfo())
    loader._eos_ids(spy, None)
    try:
        loader.check_tensor_parallel(spy, 2)
    except InvalidRequestError:
        pass
    assert spy.read and spy.read <= set(FIELDS), spy.read - set(FIELDS)


def test_loading_a_dummy_preset_imports_no_transformers():
    """~5 s of CPU an engine process start saved (an engine with the bundled model does
    not import it either: loader.bundled_config)."""
    code = ("import sys, torch\n"
            "from engine.worker.models.loader import load_model\n"
            "from engine.worker.models.loader import model_config\n"
            "for name in ('dummy:tiny', 'dummy:tiny-gpt2'):\n"
            "    load_model(name, torch.device('cpu'), torch.float32)\n"
            "model_config('dummy:qwen3-0.6b')\n"
            "assert 'transformers' not in sys.modules, 'transformers imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]

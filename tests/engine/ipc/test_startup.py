"""Start-up on a small CPU: the client side of an engine process (a server's front
included, its chat template looked up) imports neither torch nor transformers; its
tokenizer (read with `tokenizers` alone) encodes and decodes as transformers' does; the
bundled model's config read from JSON equals AutoConfig's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

CLIENT_IMPORTS = """
import json, sys
import roseplay.workload.source, roseplay.cli, engine.front.client, engine.front.processor, engine.front.stream
import engine.front.detokenizer, roseplay.serve.app
from engine.tokenizer import load_tokenizer
from roseplay.serve.chat import PLAY_TEMPLATE, pick_template
tok = load_tokenizer("default")
tok.decode(tok.encode("ROMEO: what light"), skip_special_tokens=True)
assert pick_template(tok) == PLAY_TEMPLATE       # what build_app asks at start
print(json.dumps({m: m in sys.modules for m in ("torch", "transformers")}))
"""


def test_client_path_imports_neither_torch_nor_transformers():
    out = subprocess.run([sys.executable, "-c", CLIENT_IMPORTS], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"torch": False,
                                                                 "transformers": False}


TEXTS = ["ROMEO:\nBut soft, what light through yonder window breaks?",
         "  leading spaces,\ttabs and\nnewlines  ", "<|endoftext|>KING: ay!<|endoftext|>",
         "unknown words: zyxqv ĉ 日本 🙂", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_bundled_tokenizer_matches_transformers(text):
    from transformers import AutoTokenizer

    from engine.tokenizer import DEFAULT_MODEL_DIR, FastTokenizer, load_tokenizer
    fast = load_tokenizer("default")
    assert isinstance(fast, FastTokenizer)
    hf = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR))
    ids = fast.encode(text)
    assert ids == hf.encode(text)
    assert fast.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    for skip in (True, False):
        assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert fast.eos_token == hf.eos_token            # anything else: transformers' own


def test_tokenizer_with_altering_options_uses_transformers(tmp_path):
    from engine.tokenizer import DEFAULT_MODEL_DIR, FastTokenizer, load_tokenizer_dir
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((DEFAULT_MODEL_DIR / name).read_bytes())
    cfg = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert isinstance(load_tokenizer_dir(str(tmp_path)), FastTokenizer)
    cfg["add_bos_token"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not isinstance(load_tokenizer_dir(str(tmp_path)), FastTokenizer)


def test_chat_template_is_transformers_own(tmp_path):
    """None without a template file or key; else what transformers reads (its key in
    tokenizer_config.json, or chat_template.jinja, which takes priority)."""
    from transformers import AutoTokenizer

    from engine.tokenizer import DEFAULT_MODEL_DIR, FastTokenizer, load_tokenizer_dir
    for name in ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((DEFAULT_MODEL_DIR / name).read_bytes())
    cfg = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())
    key = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for change in (None, lambda: (tmp_path / "tokenizer_config.json").write_text(
            json.dumps({**cfg, "chat_template": key})),
            lambda: (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['role'] }}")):
        if change is not None:
            change()
        fast = load_tokenizer_dir(str(tmp_path))
        assert isinstance(fast, FastTokenizer)
        want = AutoTokenizer.from_pretrained(str(tmp_path)).chat_template
        assert fast.chat_template == want and (want is None) == (change is None)


def test_bundled_config_equals_autoconfig_on_every_field_the_model_reads():
    from transformers import AutoConfig

    from engine.worker.models.layers import rope_inv_freq
    from engine.worker.models.loader import DEFAULT_MODEL_DIR, _eos_ids, _read_config
    plain = _read_config(str(DEFAULT_MODEL_DIR))
    hf = AutoConfig.from_pretrained(str(DEFAULT_MODEL_DIR))
    assert type(plain).__name__ == "SimpleNamespace"
    for field in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                  "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
                  "tie_word_embeddings", "eos_token_id"):
        assert getattr(plain, field, None) == getattr(hf, field, None), field
    a, b = rope_inv_freq(plain, plain.head_dim), rope_inv_freq(hf, hf.head_dim)
    assert a[1] == b[1] and a[0].tolist() == b[0].tolist()
    assert _eos_ids(plain, str(DEFAULT_MODEL_DIR)) == _eos_ids(hf, str(DEFAULT_MODEL_DIR))

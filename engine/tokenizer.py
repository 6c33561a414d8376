"""Tokenizers without the model stack: where a model's files are, and its tokenizer read
with the `tokenizers` package alone.

Torch-free and transformers-free on purpose: the client of an engine process (the TUI,
the bench) needs only the tokenizer, and importing transformers costs seconds on a
small CPU (it pulls in torch). A checkpoint whose tokenizer.json is the whole story
(tokenizer class PreTrainedTokenizerFast or GPT-2's, no token-adding or clean-up
options in tokenizer_config.json) gets a `FastTokenizer`; anything else gets
transformers' AutoTokenizer, as before. The engine's loader uses the same function, so
both sides of the process boundary tokenize alike.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from engine.config import DEFAULT_MODEL, InvalidRequestError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "shakespeare"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
# tokenizer classes whose encode/decode are exactly tokenizer.json's
PLAIN_CLASSES = {None, "PreTrainedTokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast"}
# tokenizer_config options that make transformers change what tokenizer.json does
ALTERING_OPTIONS = ("add_bos_token", "add_eos_token", "add_prefix_space", "legacy",
                    "do_lower_case", "tokenizer_file")
# where transformers finds a tokenizer's chat template besides tokenizer_config.json's key
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


def resolve_model_path(name: str) -> str:
    """Map 'default' to the bundled checkpoint; otherwise return the name unchanged."""
    if name == DEFAULT_MODEL:
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise InvalidRequestError(f"the bundled default model is missing at {DEFAULT_MODEL_DIR}")
        return str(DEFAULT_MODEL_DIR)
    return name


class FastTokenizer:
    """encode/decode of a tokenizer.json, as transformers' fast tokenizer does them;
    anything else (chat templates, special-token attributes) from transformers'
    AutoTokenizer, loaded on first use."""

    def __init__(self, path: str, config: dict | None = None):
        """config: tokenizer_config.json's contents as read at load (None: read here)."""
        from tokenizers import Tokenizer
        self.path = path
        self._tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self._hf = None
        self._config = _tokenizer_config(path) if config is None else config

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, not encode: it releases the GIL, so a server that tokenizes a long
        # prompt on a worker thread keeps its event loop (and every stream) running
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        """Each id's token string (transformers' name; from tokenizer.json, not by
        loading AutoTokenizer for it)."""
        return [self._tok.id_to_token(int(i)) for i in ids]

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self):
        """None where no file of the checkpoint holds a chat template (a server asks at
        start, and transformers would cost it seconds for that answer); else transformers'."""
        if not _has_chat_template(self.path, self._config):
            return None
        return self.__getattr__("chat_template")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._hf is None:
            self._hf = _auto_tokenizer(self.path)
        return getattr(self._hf, name)


def _auto_tokenizer(path: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:   # a damaged tokenizer is refused, not silently dropped
        raise InvalidRequestError(f"unreadable tokenizer in {path} (tokenizer.json / "
                                  f"tokenizer_config.json / vocab files): "
                                  f"{type(exc).__name__}: {exc}") from exc


def _tokenizer_config(path: str):
    """tokenizer_config.json's contents ({} without one); None where it is unreadable."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None


def _has_chat_template(path: str, cfg) -> bool:
    """cfg: its tokenizer_config.json's contents (_tokenizer_config)."""
    if any(os.path.exists(os.path.join(path, f)) for f in CHAT_TEMPLATE_FILES):
        return True
    return not isinstance(cfg, dict) or "chat_template" in cfg


def _is_plain(path: str, cfg) -> bool:
    """cfg: as _has_chat_template's; None: let transformers say what is wrong with it."""
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        return False
    return (isinstance(cfg, dict) and cfg.get("tokenizer_class") in PLAIN_CLASSES
            and cfg.get("clean_up_tokenization_spaces") is False
            and not any(k in cfg for k in ALTERING_OPTIONS))


def load_tokenizer_dir(path: str):
    """The tokenizer of a checkpoint directory; None when it has none."""
    if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None
    cfg = _tokenizer_config(path)          # read once: the chat-template check reads it too
    if _is_plain(path, cfg):
        try:
            return FastTokenizer(path, cfg)
        except Exception as exc:
            raise InvalidRequestError(f"unreadable tokenizer in {path} (tokenizer.json): "
                                      f"{type(exc).__name__}: {exc}") from exc
    return _auto_tokenizer(path)


def load_tokenizer(model_name: str):
    """The tokenizer of a model by name, for a front that does not load the model (the
    engine-process client); None for dummy models and checkpoints without one."""
    if model_name.startswith("dummy:"):
        return None
    path = resolve_model_path(model_name)
    return load_tokenizer_dir(path) if os.path.isdir(path) else None


@lru_cache(maxsize=None)
def byte_level_chars() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE's alphabet),
    indexed by byte."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        chars.append(chr(b) if b in keep else chr(256 + extra))
        extra += b not in keep
    return tuple(chars)

"""The vocabulary a grammar masks over, built once as the engine starts.

A grammar library needs every token's bytes. The model's tokenizer gives them as its
tokenizer.json text (both llguidance and xgrammar read it): the bundled model's
`FastTokenizer`, or a transformers fast tokenizer's backend. Dummy presets have no
tokenizer; for them a synthetic byte-level vocabulary of the model's size is made
(`synthetic_tokenizer_json`: the 256 bytes, the bundled model's BPE pieces, words with
and without a leading space, numbers, short letter runs), so a benchmark on a dummy
model masks over a vocabulary of a real one's size and shape; the front cannot decode
such outputs (it has no tokenizer), the engine's grammar can.
"""
from __future__ import annotations

import itertools
import json
import string

from engine.tokenizer import DEFAULT_MODEL_DIR, byte_level_chars


def tokenizer_json(tokenizer) -> str | None:
    """The tokenizer.json text of a model's tokenizer; None if it has none we can read
    (a slow, sentencepiece-only tokenizer)."""
    if tokenizer is None:
        return None
    inner = getattr(tokenizer, "_tok", None)          # engine/tokenizer.py FastTokenizer
    if inner is None:
        inner = getattr(tokenizer, "backend_tokenizer", None)   # transformers' fast ones
    return inner.to_str() if inner is not None and hasattr(inner, "to_str") else None


def _pieces():
    """Token texts in a fixed order: single bytes come first (built by the caller)."""
    with open(DEFAULT_MODEL_DIR / "tokenizer.json", encoding="utf-8") as f:
        bundled = json.load(f)["model"]["vocab"]
    inv = {c: bytes([b]) for b, c in enumerate(byte_level_chars())}
    for text in sorted(bundled, key=bundled.get):
        if all(c in inv for c in text):
            yield b"".join(inv[c] for c in text).decode("latin-1")
    with open(DEFAULT_MODEL_DIR / "words.txt", encoding="utf-8") as f:
        words = [w.strip() for w in f if w.strip()]
    for w in words:
        yield from (w, " " + w, w.capitalize(), " " + w.capitalize())
    for n in range(10000):
        yield from (str(n), " " + str(n))
    letters = string.ascii_lowercase
    for a, b in itertools.product(string.printable[:94], repeat=2):
        yield a + b
    for run in itertools.product(letters, repeat=3):
        yield "".join(run)
        yield " " + "".join(run)
    for run in itertools.product(letters, repeat=4):
        yield "".join(run)


def synthetic_tokenizer_json(vocab_size: int, eos_ids: tuple[int, ...]) -> str:
    """A byte-level BPE tokenizer.json of exactly vocab_size tokens (no merges: it is for
    masking, not for encoding), with a special token at each EOS id."""
    chars = byte_level_chars()
    vocab: dict[str, int] = {}
    eos = set(i for i in eos_ids if 0 <= i < vocab_size)
    ids = (i for i in range(vocab_size) if i not in eos)
    texts = itertools.chain((bytes([b]).decode("latin-1") for b in range(256)), _pieces())
    for text in texts:
        encoded = "".join(chars[b] for b in text.encode("utf-8"))
        if encoded in vocab:
            continue
        i = next(ids, None)
        if i is None:
            break
        vocab[encoded] = i
    for i in ids:                     # a vocabulary larger than the pieces: filler bytes
        vocab[f"<|filler_{i}|>"] = i
    added = [{"id": i, "content": f"<|eos_{i}|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in sorted(eos)]
    for a in added:
        vocab[a["content"]] = a["id"]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}})

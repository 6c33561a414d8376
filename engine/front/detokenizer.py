"""Incremental detokenization and stop-string matching for one request.

Two ways to turn each new token into text, one interface (`step`):
- `ByteTableDetokenizer`, for byte-level BPE tokenizers (GPT-2, Qwen, Llama 3, the bundled
  model): every token id is a fixed byte string, so a token costs one table lookup and an
  incremental UTF-8 decode (about 1 µs) instead of two `decode` calls (about 15 µs);
- `IncrementalDetokenizer`, for every other tokenizer: decodes a small window before the
  new tokens, as vLLM's incremental detokenizer does.
The table is built once per tokenizer and checked against the tokenizer's own `decode`
on random id sequences; a tokenizer it does not reproduce exactly keeps the window way.
"""
from __future__ import annotations

import codecs
import random

from engine.tokenizer import byte_level_chars

_TABLE_ATTR = "_roseplay_byte_table"     # cached on the tokenizer object
_ADDED_ATTR = "_roseplay_added_ids"
_CHECK_SEQUENCES = 64
_CHECK_LEN = 12
# text that transformers' clean_up_tokenization would change: a decode that does it differs
_PROBE = "Hi , it 's here . Isn 't it ? I 'm sure ! We 've seen , they 're here ."


def make_detokenizer(tokenizer, stop: tuple[str, ...] = (), skip_special_tokens: bool = True,
                     include_stop: bool = False, spaces_between_special_tokens: bool = True):
    """A request's detokenizer (SamplingParams' stop, skip_special_tokens,
    include_stop_str_in_output, spaces_between_special_tokens): the byte table skips
    special tokens, so a request that shows them takes the decoding window."""
    table = byte_table(tokenizer) if skip_special_tokens else None
    detok = ByteTableDetokenizer(table, stop) if table is not None else \
        IncrementalDetokenizer(tokenizer, stop, skip_special_tokens,
                               spaces_between_special_tokens)
    detok.include_stop = include_stop
    return detok


def decode(tokenizer, ids, skip_special_tokens: bool = True,
           spaces_between_special_tokens: bool = True) -> str:
    """`tokenizer.decode` with vLLM's spaces_between_special_tokens. False (with the
    special tokens shown) joins an added token to the added token before it without the
    space a decoder puts between tokens: the ids are decoded in pieces cut between two
    added tokens, as vLLM's fast detokenizer returns such a token's text alone
    (transformers' decode takes the option and, since v5, ignores it)."""
    ids = list(ids)
    if skip_special_tokens or spaces_between_special_tokens:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    added = added_token_ids(tokenizer)
    cuts = [i for i in range(1, len(ids)) if ids[i] in added and ids[i - 1] in added]
    return "".join(tokenizer.decode(ids[a:b], skip_special_tokens=False)
                   for a, b in zip([0] + cuts, cuts + [len(ids)]))


def added_token_ids(tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's added tokens (special or not), cached on it."""
    cached = getattr(tokenizer, _ADDED_ATTR, None)
    if cached is not None:
        return cached
    backend = _backend(tokenizer)
    found = backend.get_added_tokens_decoder() if backend is not None else \
        getattr(tokenizer, "added_tokens_decoder", {})
    ids = frozenset(found)
    try:
        setattr(tokenizer, _ADDED_ATTR, ids)
    except (AttributeError, TypeError):
        pass
    return ids


def _match_stop(stop: tuple[str, ...], text: str, new_text: str,
                include: bool = False) -> tuple[str, str | None]:
    """Cut new_text at the first stop string that ends in the part added to text (after
    it with `include`: vLLM's include_stop_str_in_output); and that string (vLLM's
    stop_reason), None if none matched."""
    if stop:
        window_start = max(0, len(text) - max(map(len, stop)) + 1)
        cut = [(i, s) for s in stop if (i := new_text.find(s, window_start)) >= 0]
        if cut:
            i, s = min(cut, key=lambda c: c[0])
            return new_text[:i + len(s) if include else i], s
    return new_text, None


class ByteTableDetokenizer:
    """Text deltas from a token -> bytes table; incomplete UTF-8 sequences are held back
    until their last byte arrives, invalid ones become U+FFFD (as `decode` makes them)."""

    include_stop = False

    def __init__(self, table: list[bytes], stop: tuple[str, ...] = ()):
        self.table = table
        self.stop = stop
        self.read = 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def step(self, output_ids: list[int], text: str) -> tuple[str, str | None]:
        """Return (new full text, the stop string it hit or None)."""
        table = self.table
        n = len(table)
        new = output_ids[self.read:]
        self.read = len(output_ids)
        data = b"".join(table[t] if 0 <= t < n else b"" for t in new)
        delta = self.utf8.decode(data)
        if not delta:
            return text, None
        return _match_stop(self.stop, text, text + delta, self.include_stop)


class IncrementalDetokenizer:
    """Turns output tokens into text deltas without re-decoding the whole output.

    Decodes a small window before the new tokens so that merged byte-level pieces come
    out right, and holds back text ending in U+FFFD (an incomplete UTF-8 sequence).
    """

    include_stop = False

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip = skip_special_tokens
        self.spaces = spaces_between_special_tokens
        self.prefix_offset = 0
        self.read_offset = 0

    def step(self, output_ids: list[int], text: str) -> tuple[str, str | None]:
        """Return (new full text, the stop string it hit or None)."""
        if self.tokenizer is None:
            return text, None
        tok, skip, spaces = self.tokenizer, self.skip, self.spaces
        prefix = decode(tok, output_ids[self.prefix_offset:self.read_offset], skip, spaces)
        full = decode(tok, output_ids[self.prefix_offset:], skip, spaces)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return text, None
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(output_ids)
        return _match_stop(self.stop, text, text + delta, self.include_stop)


def byte_table(tokenizer) -> list[bytes] | None:
    """The token -> bytes table of a byte-level BPE tokenizer (special tokens -> b""),
    cached on the tokenizer; None when the tokenizer is not one or the table does not
    reproduce its decode exactly."""
    cached = getattr(tokenizer, _TABLE_ATTR, False)
    if cached is not False:
        return cached
    table = _build_table(tokenizer)
    if table is not None and not _reproduces(tokenizer, table):
        table = None
    try:
        setattr(tokenizer, _TABLE_ATTR, table)
    except (AttributeError, TypeError):
        pass
    return table


def _backend(tokenizer):
    """The `tokenizers.Tokenizer` behind roseplay's FastTokenizer or transformers' fast one."""
    backend = getattr(tokenizer, "__dict__", {}).get("_tok")    # engine.tokenizer.FastTokenizer
    if backend is None:      # (asked first: its __getattr__ would load transformers)
        backend = getattr(tokenizer, "backend_tokenizer", None)   # transformers' fast one
    return backend


def _build_table(tokenizer) -> list[bytes] | None:
    try:
        from tokenizers import decoders
    except ImportError:
        return None
    backend = _backend(tokenizer)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    char_to_byte = {c: b for b, c in enumerate(byte_level_chars())}
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    table = []
    for i in range(backend.get_vocab_size(with_added_tokens=True)):
        piece = backend.id_to_token(i)
        if piece is None or i in special:
            table.append(b"")
            continue
        table.append(b"".join(bytes([char_to_byte[c]]) if c in char_to_byte else c.encode()
                              for c in piece))
    return table


def _reproduces(tokenizer, table: list[bytes]) -> bool:
    """The table decodes random id sequences (and every single id of a sample) exactly as
    the tokenizer does."""
    rng = random.Random(0)
    n = len(table)
    seqs = [[rng.randrange(n) for _ in range(_CHECK_LEN)] for _ in range(_CHECK_SEQUENCES)]
    seqs += [[i] for i in rng.sample(range(n), min(n, 256))]
    try:
        seqs.append(list(tokenizer.encode(_PROBE, add_special_tokens=False)))
        for ids in seqs:
            want = tokenizer.decode(ids, skip_special_tokens=True)
            if b"".join(table[i] for i in ids).decode("utf-8", "replace") != want:
                return False
    except Exception:
        return False
    return True

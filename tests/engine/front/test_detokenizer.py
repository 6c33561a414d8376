"""The byte-table detokenizer streams exactly what the tokenizer's decode gives; other
tokenizers keep the decode-window detokenizer."""
import random

import pytest
from tokenizers import Tokenizer, decoders, models

from engine.errors import InvalidRequestError
from engine.front.detokenizer import (ByteTableDetokenizer, IncrementalDetokenizer, byte_table,
                                      decode, make_detokenizer)
from engine.request import SamplingParams
from engine.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("default")


def stream(detok, ids):
    text, out = "", []
    for k in range(1, len(ids) + 1):
        out.append(ids[k - 1])
        text, hit = detok.step(out, text)
        if hit:
            return text, True
    return text, False


def test_the_bundled_tokenizer_gets_a_table(tok):
    table = byte_table(tok)
    assert table is not None and len(table) == len(tok)
    assert isinstance(make_detokenizer(tok), ByteTableDetokenizer)
    eos = tok.encode("<|endoftext|>", add_special_tokens=False)
    assert [table[i] for i in eos] == [b""]          # special tokens decode to nothing


def test_streamed_text_is_the_decoded_text(tok):
    table, rng = byte_table(tok), random.Random(7)
    samples = [tok.encode("ROMEO: café, naïve 日本語 🌹 — thou art!")]
    samples += [[rng.randrange(len(table)) for _ in range(rng.randrange(1, 50))]
                for _ in range(200)]
    for ids in samples:
        text, _ = stream(ByteTableDetokenizer(table), ids)
        full = tok.decode(ids, skip_special_tokens=True)
        # all of it, or all but an incomplete UTF-8 sequence at the end (held back)
        assert text == full or (full.startswith(text) and full[len(text):] == "\ufffd"), ids


def test_multibyte_characters_wait_for_their_last_byte(tok):
    table = byte_table(tok)
    rose = "🌹".encode()
    single = {b: i for i, b in enumerate(table) if len(b) == 1}
    if not all(bytes([c]) in single for c in rose):
        pytest.skip("no single-byte tokens for this character")
    ids = [single[bytes([c])] for c in rose]
    detok, text, seen = ByteTableDetokenizer(table), "", []
    for k in range(1, 5):
        text, _ = detok.step(ids[:k], text)
        seen.append(text)
    assert seen == ["", "", "", "🌹"]


def test_stop_strings_cut_the_text(tok):
    ids = tok.encode("ROMEO: But soft, what light through yonder window breaks?")
    for make in (lambda s: ByteTableDetokenizer(byte_table(tok), s),
                 lambda s: IncrementalDetokenizer(tok, s)):
        text, hit = stream(make(("light",)), ids)
        assert hit and text == "ROMEO: But soft, what "


class WordTokenizer:
    """A tokenizer that is not byte-level (word pieces joined by the WordPiece decoder)."""

    def __init__(self):
        vocab = {"[UNK]": 0, "hello": 1, "world": 2, "##s": 3}
        self._tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        self._tok.decoder = decoders.WordPiece()

    def decode(self, ids, skip_special_tokens=False):
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


class CleaningTokenizer:
    """Byte-level, but its decode changes the text (as clean_up_tokenization_spaces does)."""

    def __init__(self, inner):
        self._tok = inner.__dict__["_tok"]

    def encode(self, text, add_special_tokens=True):
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=False):
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens).replace(" ,", ",")


def test_other_tokenizers_keep_the_decode_window(tok):
    word = WordTokenizer()
    assert byte_table(word) is None
    detok = make_detokenizer(word)
    assert isinstance(detok, IncrementalDetokenizer)
    assert stream(detok, [1, 2, 3])[0] == word.decode([1, 2, 3])
    assert byte_table(CleaningTokenizer(tok)) is None     # the check on decode catches it


class SpecialWordTokenizer(WordTokenizer):
    """WordTokenizer with two special tokens: its decoder puts a space between any two
    tokens, special ones included."""

    def __init__(self):
        super().__init__()
        self._tok.add_special_tokens(["[SEP]", "[EOS]"])     # ids 4, 5


def test_spaces_between_special_tokens_false_joins_two_in_a_row():
    """vLLM's spaces_between_special_tokens: False drops the space between two special
    tokens in a row, shown (skip_special_tokens False), streamed or decoded at once; the
    space before a special token that follows a word stays (it was always the
    decoder's)."""
    tok, ids = SpecialWordTokenizer(), [1, 4, 5, 2, 4]
    assert tok.decode(ids) == "hello [SEP] [EOS] world [SEP]"
    assert decode(tok, ids, False, False) == "hello [SEP][EOS] world [SEP]"
    assert decode(tok, ids, False, True) == tok.decode(ids)
    assert decode(tok, ids, True, False) == "hello world"
    streamed = make_detokenizer(tok, skip_special_tokens=False,
                                spaces_between_special_tokens=False)
    assert stream(streamed, ids)[0] == "hello [SEP][EOS] world [SEP]"
    with pytest.raises(InvalidRequestError, match="spaces_between_special_tokens must be"):
        SamplingParams(spaces_between_special_tokens=1)

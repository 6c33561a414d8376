"""Incremental detokenization and stop-string matching for one request."""
from __future__ import annotations


class IncrementalDetokenizer:
    """Turns output tokens into text deltas without re-decoding the whole output.

    Decodes a small window before the new tokens so that merged byte-level pieces come
    out right, and holds back text ending in U+FFFD (an incomplete UTF-8 sequence).
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.prefix_offset = 0
        self.read_offset = 0

    def step(self, output_ids: list[int], text: str) -> tuple[str, bool]:
        """Return (new full text, hit_stop)."""
        if self.tokenizer is None:
            return text, False
        decode = self.tokenizer.decode
        prefix = decode(output_ids[self.prefix_offset:self.read_offset], skip_special_tokens=True)
        full = decode(output_ids[self.prefix_offset:], skip_special_tokens=True)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return text, False
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(output_ids)
        new_text = text + delta
        if self.stop:
            window_start = max(0, len(text) - max(map(len, self.stop)) + 1)
            cut = [i for s in self.stop if (i := new_text.find(s, window_start)) >= 0]
            if cut:
                return new_text[:min(cut)], True
        return new_text, False

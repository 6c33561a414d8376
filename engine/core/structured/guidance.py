"""The llguidance backend (vLLM's "guidance"): grammars compiled to template matchers,
one matcher per request (a copy of its grammar's template), masks filled in parallel.

Why llguidance by default (docs/STRUCTURED_OUTPUTS.md "Choosing the library"): it reads the
tokenizer.json text alone (no transformers import in the engine process; xgrammar's
import alone took 4 s here), its grammar construction is bounded by fuel limits
(LLParserLimits: a hostile schema costs bounded work, deterministic on any machine,
not a wall-clock guess), it builds lexer states lazily (a compile is milliseconds,
the first masks pay the rest) and it fills a batch's masks on its own threads without
the GIL, with speculative drafts in the same call.
"""
from __future__ import annotations

import llguidance
import numpy as np

from engine.core.structured.common import GrammarError
from engine.grammars import JsonStyle, guidance_grammar
from engine.structured_outputs import StructuredOutputsParams


class GuidanceMatcher:
    """One request's parser state (llguidance.LLMatcher): what its output has consumed."""
    __slots__ = ("m",)

    def __init__(self, matcher: llguidance.LLMatcher):
        self.m = matcher

    def consume(self, tokens: list[int]) -> bool:
        # one by one: llguidance 1.9's consume_tokens([eos]) fails on a matcher whose
        # grammar is complete, where consume_token(eos) succeeds
        consume = self.m.consume_token
        return all(consume(t) for t in tokens)

    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar accepts in a row, from here (no change)."""
        return self.m.validate_tokens(tokens)

    def rollback(self, n: int) -> None:
        self.m.rollback(n)

    def is_stopped(self) -> bool:
        return self.m.is_stopped()

    def is_accepting(self) -> bool:
        return self.m.is_accepting()

    def error(self) -> str:
        return self.m.get_error() if self.m.is_error() else ""

    def forced_bytes(self) -> bytes:
        """Bytes every continuation starts with (what the grammar alone decides next)."""
        return self.m.compute_ff_bytes()

    def fill(self, row: np.ndarray) -> None:
        """This matcher's mask into one bitmask row (int32 words)."""
        self.m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)


class GuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: tuple[int, ...],
                 config=None):
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                eos_token=list(eos_ids) or None)
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.words = -(-vocab_size // 32)          # int32 words of one bitmask row
        self.limits = llguidance.LLParserLimits(verbose_errors=False)
        self.config = config            # StructuredOutputsConfig: its JSON switches
        self.executor = llguidance.LLExecutor()

    def grammar(self, p: StructuredOutputsParams) -> str:
        """The request's constraint as an llguidance grammar (text)."""
        try:
            return guidance_grammar(p, JsonStyle.of(p, self.config))
        except (ValueError, TypeError, RecursionError, AssertionError) as exc:
            raise GrammarError(str(exc)[:500]) from None

    def compile(self, p: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A template matcher of the request's grammar (requests copy it), its first mask
        computed. Runs on a compile thread; llguidance drops the GIL while it builds."""
        matcher = llguidance.LLMatcher(self.tokenizer, self.grammar(p), log_level=0,
                                       limits=self.limits)
        if not matcher.is_error():     # the first mask: a grammar that admits nothing, or
            matcher.compute_bitmask()  # whose lexer is over its limits, fails here
        if matcher.is_error():
            raise GrammarError(matcher.get_error()[:500])
        return matcher

    def matcher(self, compiled: llguidance.LLMatcher) -> GuidanceMatcher:
        return GuidanceMatcher(compiled.deep_copy())

    def first_bytes(self) -> np.ndarray:
        """Each token's first byte (-1: a special or empty token): the TUI's state words."""
        out = np.full(self.vocab_size, -1, np.int16)
        tok = self.tokenizer
        for i in range(min(tok.vocab_size, self.vocab_size)):
            if not tok.is_special_token(i):
                b = tok.decode_bytes([i])
                if b:
                    out[i] = b[0]
        return out

    def fill(self, entries: list[tuple[GuidanceMatcher, int, list[int]]],
             bitmask: np.ndarray) -> None:
        """Masks of a step into `bitmask` [C, words] on llguidance's threads: each entry
        (matcher, row, drafts) fills row, and row + 1 + j the mask after draft j (the
        matcher advances through the drafts and is rolled back)."""
        ptr, size, rows = bitmask.ctypes.data, self.words * 4, bitmask.shape[0]
        plain = [(m.m, row) for m, row, drafts in entries if not drafts]
        if plain:
            self.executor.unsafe_compute_mask_ptr(plain, ptr, size, rows)
        if len(plain) < len(entries):
            self.executor.unsafe_compute_mask_ptr_with_draft_token(
                [(m.m, row, drafts) for m, row, drafts in entries if drafts], ptr, size, rows)


"""The xgrammar backend (vLLM's default; here the alternative: docs/STRUCTURED_OUTPUTS.md
"Choosing the library"): grammars compiled to CompiledGrammar, one GrammarMatcher per
request, the step's plain rows filled by one BatchGrammarMatcher call (its own threads).

Its vocabulary comes from the same tokenizer.json text as llguidance's: the tokens in id
order, and the vocabulary's type (byte-level, byte-fallback, raw) and prefix-space rule
as xgrammar detects them from that text. What it lacks beside llguidance: no fuel
limits (a hostile schema is bounded only by compile_timeout, and its thread runs on),
no error text from a matcher, and drafts checked token by token with a rollback.
"""
from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from engine.core.structured.common import GrammarError
from engine.grammars import JsonStyle, reason, xgrammar_grammar
from engine.structured_outputs import StructuredOutputsParams
from engine.worker.host_masks import tensor_view



class XGrammarMatcher:
    """One request's parser state (xgrammar.GrammarMatcher)."""
    __slots__ = ("m",)

    def __init__(self, matcher):
        self.m = matcher

    def consume(self, tokens: list[int]) -> bool:
        accept = self.m.accept_token
        return all(accept(t) for t in tokens)

    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar accepts in a row, from here (no change)."""
        n = 0
        for t in tokens:
            if self.m.is_terminated() or not self.m.accept_token(t):
                break
            n += 1
        if n:
            self.m.rollback(n)
        return n

    def rollback(self, n: int) -> None:
        self.m.rollback(n)

    def is_stopped(self) -> bool:
        return self.m.is_terminated()

    def is_accepting(self) -> bool:
        return self.m.is_completed()

    def error(self) -> str:
        return ""

    def forced_bytes(self) -> bytes:
        if self.m.is_terminated():     # (it took EOS: nothing comes next; xgrammar raises)
            return b""
        return self.m.find_jump_forward_string().encode("utf-8", "surrogatepass")


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: tuple[int, ...],
                 config=None):
        import xgrammar as xgr      # here: its import loads transformers and rich (the
        self.xgr = xgr              # engine imports no UI package unless this backend runs)
        vocab = Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True)
        encoded = [""] * vocab_size
        for token, i in vocab.items():
            if i < vocab_size:
                encoded[i] = token
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer_json)
        self.info = xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size,
                                      stop_token_ids=list(eos_ids),
                                      add_prefix_space=meta["add_prefix_space"])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher()
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.words = -(-vocab_size // 32)
        self.config = config            # StructuredOutputsConfig: its JSON switches

    def compile(self, p: StructuredOutputsParams):
        """The request's compiled grammar, checked by a first mask."""
        try:
            compiled = self._compile(p)
            self.xgr.GrammarMatcher(compiled).fill_next_token_bitmask(
                tensor_view(np.empty((1, self.words), np.int32)))
        except (RuntimeError, ValueError, TypeError, RecursionError) as exc:
            raise GrammarError(reason(exc)) from None
        return compiled

    def _compile(self, p: StructuredOutputsParams):
        return self.compiler.compile_grammar(
            xgrammar_grammar(p, JsonStyle.of(p, self.config), self.info))

    def matcher(self, compiled) -> XGrammarMatcher:
        return XGrammarMatcher(self.xgr.GrammarMatcher(compiled))

    def first_bytes(self) -> np.ndarray:
        """Each token's first byte (-1: a special or empty token)."""
        out = np.full(self.vocab_size, -1, np.int16)
        special = set(self.info.special_token_ids)
        for i, b in enumerate(self.info.decoded_vocab[:self.vocab_size]):
            if b and i not in special:
                out[i] = b[0]
        return out

    def fill(self, entries: list[tuple[XGrammarMatcher, int, list[int]]],
             bitmask: np.ndarray) -> None:
        """Masks of a step into `bitmask` [C, words]: each entry fills its row, and
        row + 1 + j the mask after draft j (accepted one by one, then rolled back; a row
        after a draft the grammar refuses, or after a drafted EOS, allows everything: its
        sample is discarded)."""
        view = tensor_view(bitmask)
        plain = [(m.m, row) for m, row, drafts in entries if not drafts]
        if plain:
            self.batch.batch_fill_next_token_bitmask([m for m, _ in plain], view,
                                                     [row for _, row in plain])
        for m, row, drafts in entries:
            if not drafts:
                continue
            m.m.fill_next_token_bitmask(view, row)
            taken = 0
            for j, t in enumerate(drafts):
                if taken == j and not m.m.is_terminated() and m.m.accept_token(t):
                    taken += 1
                    if not m.m.is_terminated():       # (after a drafted EOS: nothing
                        m.m.fill_next_token_bitmask(view, row + 1 + j)   # follows)
                        continue
                bitmask[row + 1 + j] = -1
            if taken:
                m.m.rollback(taken)

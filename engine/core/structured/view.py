"""What the TUI shows of a constrained request's last step (docs/STRUCTURED_OUTPUTS.md "Shown
live"): how many tokens the grammar allowed, the model's own top choices with the ones
the grammar struck out, the token taken, and the grammar's state in words.

Only for requests that ask for logprobs (the TUI's typed prompts ask with raw_logprobs,
the model's own top-n): the state is read from the matcher when the mask is filled
(before the token), the rest from that mask row when the token is read. The state's
words come from what the mask allows, not from a parser of our own: the bytes every
continuation is forced to start with ("expecting '\":'"), else the first bytes of the
allowed tokens ("in string" when nearly any text goes on, "in number" when only digits
and what ends a number do).
"""
from __future__ import annotations

import string

import numpy as np

from engine.snapshot import GrammarView

_DIGITS = frozenset(b"0123456789-+.eE")
_NUMBER_END = frozenset(b",}] \n\r\t")
_LETTERS = frozenset(string.ascii_letters.encode())


def popcount(row: np.ndarray) -> int:
    return int(np.unpackbits(row.view(np.uint8)).sum())


def allowed_ids(row: np.ndarray, vocab: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])


def describe(forced: bytes, stopped: bool, firsts: set[int], eos_only: bool) -> str:
    """The grammar's state in a few words, from the mask it gave."""
    if stopped or eos_only:
        return "complete"
    if forced:
        return f"expecting {forced.decode('utf-8', 'replace')!r}"
    if len(firsts & _LETTERS) > 40 and ord('"') in firsts:
        return "in string"
    if firsts and firsts <= (_DIGITS | _NUMBER_END):
        return "in number"
    shown = "".join(sorted(chr(b) for b in firsts if 32 < b < 127))[:12]
    return f"expecting one of {shown!r}" if shown else "open"


class StepViews:
    """Views of the requests that asked for logprobs, across one step."""

    def __init__(self):
        self._firsts: np.ndarray | None = None     # each token's first byte (-1: none)

    def _first_bytes(self, backend) -> np.ndarray:
        if self._firsts is None or self._firsts.shape[0] != backend.vocab_size:
            self._firsts = backend.first_bytes()
        return self._firsts

    def before(self, step, bitmask: np.ndarray, backend) -> list | None:
        """(request, mask row, state) of the step's view rows, read before the tokens."""
        out, k = [], 0
        for r, _, drafts in step.entries:
            m = r.grammar.matcher
            if r.params.logprobs is not None and m is not None:
                ids = allowed_ids(bitmask[k], backend.vocab_size)
                firsts = self._first_bytes(backend)[ids[:4096]]
                eos_only = set(ids.tolist()) <= set(backend.eos_ids) if ids.shape[0] < 4 \
                    else False
                out.append((r, k, describe(m.forced_bytes(), m.is_stopped(),
                                           set(firsts[firsts >= 0].tolist()), eos_only),
                            backend.vocab_size))
            k += 1 + len(drafts)
        return out or None

    @staticmethod
    def after(step, row_logprobs) -> None:
        """Each view row's allowed count, the model's top-n marked allowed or not, and the
        token taken (its sample row's logprobs: entry 0 the sampled token)."""
        rows = {id(r): row for r, row, _ in step.entries}
        bitmask = step.mask.bitmask
        for r, k, state, vocab in step.views:
            lp = row_logprobs[rows[id(r)]] if row_logprobs is not None else None
            top, token = (), -1
            if lp is not None:
                token = lp.token_ids[0]
                model = lp.raw if lp.raw is not None else lp
                top = tuple((t, v, _allowed(bitmask[k], t))
                            for t, v in zip(model.token_ids[1:], model.logprobs[1:]))
            r.grammar.view = GrammarView(r.grammar.params.kind, state, popcount(bitmask[k]),
                                         vocab, top, token)


def _allowed(row: np.ndarray, token: int) -> bool:
    return token < row.shape[0] * 32 and bool((int(row[token >> 5]) >> (token & 31)) & 1)

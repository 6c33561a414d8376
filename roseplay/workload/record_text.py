"""The generated text a recording keeps: each request's output decoded while recording.

The engine never detokenizes for the UI: a RequestView carries its last OUTPUT_TAIL
token ids and the live app decodes them with the engine's tokenizer. A replay loads no
tokenizer (nor torch), so the recorder writes the text itself: `TextTracker` follows
each request's output ids from frame to frame (the new ones are the end of the tail)
and puts the decoded text in the view's `text` field, which frames store as appended
suffixes (roseplay/workload/frames.py `text+`). Ids that went by between two frames unseen (more
than a tail's worth) leave a "…" in the text.

The token scrub and the token choices show single tokens. `PieceTracker` writes, once
each, the text of every token id a frame shows as a token (a trace's tokens and top
candidates, a request's latest logprobs, a grammar's choices) in the frame's `pieces`
map; a replay reads them all into a `RecordedVocab`, which decodes those ids as the
live app's tokenizer did.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from engine.snapshot import EngineSnapshot

GAP = " … "
FOLD = 1024     # ids kept undecoded at most (a long output's start is decoded once)


class TextTracker:
    """Per request: the text of the ids decoded so far, and the ids since the last gap."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ids: dict[str, tuple[str, list[int], int]] = {}   # id -> (before, ids, count)
        self._text: dict[str, tuple[int, str]] = {}             # id -> (count, text)

    def with_text(self, snap: EngineSnapshot) -> EngineSnapshot:
        """`snap` with each request's generated text in `text` (requests it no longer
        holds are forgotten)."""
        views = tuple(self._view(v) for v in snap.requests)
        live = {v.request_id for v in snap.requests}
        for rid in [r for r in self._ids if r not in live]:
            del self._ids[rid]
            self._text.pop(rid, None)
        return dataclasses.replace(snap, requests=views)

    def _view(self, view):
        if view.text or not view.output_tokens or not view.output_tail:
            return view
        rid, n = view.request_id, view.output_tokens
        cached = self._text.get(rid)
        if cached is None or cached[0] != n:
            cached = self._text[rid] = (n, self._decode(rid, n, list(view.output_tail)))
        return dataclasses.replace(view, text=cached[1])

    def _decode(self, rid: str, n: int, tail: list[int]) -> str:
        before, ids, count = self._ids.get(rid, ("", [], 0))
        new = n - count
        if new < 0:                            # recomputed from its prompt (preempted)
            before, ids, count, new = "", [], 0, n
        if new > len(tail) or (count == 0 and n > len(tail)):   # ids went by unseen
            before = self._join(before, ids) + GAP if (ids or before) else "…"
            ids = list(tail)
        elif new:
            ids = ids + tail[len(tail) - new:]
        if len(ids) > FOLD:          # decode the old part once: each frame decodes the rest
            before, ids = self._join(before, ids[:FOLD // 2]), ids[FOLD // 2:]
        self._ids[rid] = (before, ids, n)
        return self._join(before, ids)

    def _join(self, before: str, ids: list[int]) -> str:
        return before + (self.tokenizer.decode(ids, skip_special_tokens=True) if ids else "")


class PieceTracker:
    """The token pieces a frame adds: {str(id): tokenizer.decode([id])} for the ids it
    shows as tokens that no earlier frame of the recording wrote."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._sent: set[int] = set()
        self._walked: set[tuple[str, int, int]] = set()     # the last frame's traces

    def new_pieces(self, snap: EngineSnapshot) -> dict[str, str]:
        ids = set(self._view_ids(snap.requests))
        keys = [(t.request_id, t.num_tokens, len(t)) for t in snap.traces]
        for key, t in zip(keys, snap.traces):     # a trace stays in the window until it
            if key not in self._walked:           # leaves: walk it once, when it comes
                ids.update(trace_ids(t))
        self._walked = set(keys)
        ids -= self._sent
        self._sent |= ids
        return {str(i): self.tokenizer.decode([i]) for i in sorted(ids)}

    @staticmethod
    def _view_ids(views):
        for v in views:
            lp = v.logprobs
            while lp is not None:
                yield from lp.token_ids
                lp = lp.raw
            if v.grammar is not None:
                yield from (tok for tok, _, _ in v.grammar.top)
                if v.grammar.token >= 0:
                    yield v.grammar.token


def trace_ids(t) -> set[int]:
    """Every token id a trace holds: its tokens and each token's logprobs entries."""
    n = len(t)
    arrays = [t.ids()] + [np.frombuffer(b, "<i4", n * t.top) for b in (t.logprobs,
                                                                      t.raw_logprobs) if b]
    return {int(i) for a in arrays for i in np.unique(a)}


class RecordedVocab:
    """A replay's stand-in for the tokenizer: the pieces the recording wrote (ids it never
    wrote read #id). It decodes tokens one by one, as the scrub and the choices ask;
    whole outputs come from the text the recording kept, so a decode that skips special
    tokens (how an output is decoded) gives ""."""

    def __init__(self, pieces: dict[int, str]):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            return ""
        return "".join(self.pieces.get(int(i), f"#{int(i)}") for i in ids)

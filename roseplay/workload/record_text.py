"""The generated text a recording keeps: each request's output decoded while recording.

The engine never detokenizes for the UI: a RequestView carries its last OUTPUT_TAIL
token ids and the live app decodes them with the engine's tokenizer. A replay loads no
tokenizer (nor torch), so the recorder writes the text itself: `TextTracker` follows
each request's output ids from frame to frame (the new ones are the end of the tail)
and puts the decoded text in the view's `text` field, which frames store as appended
suffixes (roseplay/workload/frames.py `text+`). Ids that went by between two frames unseen (more
than a tail's worth) leave a "…" in the text.
"""
from __future__ import annotations

import dataclasses

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

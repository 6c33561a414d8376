"""Token agreement of the two sides of `roseplay --compare`: the same requests (one
workload stream, the same ids on both sides) finish on each engine; were their output
tokens the same? With greedy requests (`--temperature 0`) a knob that must not change
the numbers (prefix caching, chunking, the policies) shows every request identical; one
that does (`kv_cache_dtype=auto,fp8`) shows how many diverge and where.

A RequestView carries its last OUTPUT_TAIL output tokens (engine/snapshot.py): a request
counts as identical when both sides emitted as many tokens with the same tail; where
the whole output fits the tail, the first differing token is known too. A snapshot
keeps only the latest finished requests, and one side may run far ahead of the other,
so a request finished on one side waits here (at most PENDING of them) for the other.
"""
from __future__ import annotations

import statistics

from engine.codes import FINISHED
from engine.snapshot import OUTPUT_TAIL

PENDING = 4096      # finished requests a side may hold while the other has not finished them


class TokenAgreement:
    """Fed both sides' snapshots after every pull; keeps one verdict per request id."""

    def __init__(self):
        self.identical = 0
        self.diverged = 0
        self.first_diffs: list[int] = []       # diverged requests whose whole output is known
        self._pending: tuple[dict, dict] = ({}, {})   # request id -> (tokens, tail) per side
        self._judged: set[str] = set()

    def feed(self, snap_a, snap_b) -> None:
        for side, snap in enumerate((snap_a, snap_b)):
            mine, other = self._pending[side], self._pending[1 - side]
            for r in snap.requests:
                rid = r.request_id
                if r.state != FINISHED or rid in self._judged or rid in mine:
                    continue
                if rid in other:
                    self._judged.add(rid)
                    got = (r.output_tokens, tuple(r.output_tail))
                    self._judge(*((other.pop(rid), got) if side else (got, other.pop(rid))))
                elif len(mine) < PENDING:
                    mine[rid] = (r.output_tokens, tuple(r.output_tail))

    def _judge(self, a: tuple[int, tuple], b: tuple[int, tuple]) -> None:
        if a == b:
            self.identical += 1
            return
        self.diverged += 1
        (na, tail_a), (nb, tail_b) = a, b
        if max(na, nb) <= OUTPUT_TAIL:
            pairs = zip(tail_a, tail_b)
            self.first_diffs.append(next((i for i, (x, y) in enumerate(pairs) if x != y),
                                         min(na, nb)))

    def text(self, width: int = 0) -> str:
        """"B's tokens = A's in 31/40 requests · 9 diverged after 12 equal tokens
        (median)", or the longest shorter form that fits `width` (0: any): a form cut
        short had read "(first at token 18, medi…", a first difference, not a median."""
        n = self.identical + self.diverged
        if not n:
            return "B's tokens = A's: no request finished on both sides yet"
        forms = [f"B's tokens = A's in {self.identical}/{n} requests",
                 f"B's tokens = A's in {self.identical}/{n}", f"same tokens {self.identical}/{n}"]
        if self.diverged:
            d = self.diverged
            after = statistics.median(self.first_diffs) if self.first_diffs else None
            tails = ([f" · {d} diverged after {after:g} equal tokens (median)",
                      f" · {d} diverged after {after:g} equal (median)",
                      f" · {d} diverged, median after {after:g}"] if after is not None
                     else [f" · {d} diverged"] * 3)
            forms = [forms[0] + tails[0], forms[1] + tails[1], forms[2] + tails[2],
                     forms[2] + f" · {d} diverged", forms[2]]
        return next((f for f in forms if not width or len(f) <= width), forms[-1])

"""TTFT split into where the time went: queued (arrival to first scheduled), prefill
(first scheduled to the scheduling of its last prompt chunk: the earlier chunks and the
waits between them), and the last chunk's step until the first token is emitted (that
chunk's logits give the first token). The parts come from the engine's timestamps
(RequestView.ttft_split, engine/snapshot.py) and add up to the request's TTFT.

`request_split` is the Selected panel's line for one request; `window_split` the Timing
panel's line: each part's share of the summed TTFT of the requests whose first token came
in its window, the requests of its TTFT row (latency.window_firsts).
"""
from __future__ import annotations

import math

from rich.text import Text

from roseplay.tui.widgets import theme
from roseplay.tui.widgets.latency import window_firsts
from roseplay.tui.widgets.requests import fmt_ms

PART_COLORS = ("#9aa0aa", "prefill", "decode")   # queued, prefill, last chunk -> token


def _color(key: str) -> str:
    return key if key.startswith("#") else theme.color(key)


def split_bar(parts, width: int) -> Text:
    """The parts side by side, in proportion, `width` cells (a part of 1% or more
    gets at least one)."""
    total = sum(parts)
    t = Text()
    if total <= 0:
        return t.append("░" * width, "dim")
    cells = [max(1 if p >= 0.01 * total else 0, round(p / total * width)) for p in parts]
    cells[0] += width - sum(cells)            # rounding: the queue takes the rest
    for n, key in zip(cells, PART_COLORS):
        t.append("█" * max(0, n), _color(key))
    return t


def request_split(r, now: float, width: int = 1000, stopped: bool = False) -> Text:
    """One request's TTFT split (the chunk numbers say which part is which), the
    longest form that fits `width`; or how far it got (queued so far, chunks so far;
    `stopped`: before the engine stopped, which ended the wait)."""
    parts = r.ttft_split()
    if parts is None and r.ttft is not None:    # a recording made before the engine
        #                                          stamped scheduled_ts: it read "TTFT:
        #                                          never scheduled" for a decoding request
        forms = [" (no queue/prefill split in this recording)", " (no split recorded)", ""]
        t = Text(f"TTFT {fmt_ms(r.ttft)}", "bold")
        return t.append(next(f for f in forms if t.cell_len + len(f) <= width or not f),
                        "dim")
    if parts is None:
        return _unfinished(r, now, "before the stop" if stopped else "so far", width)
    forms = [_split_words(r, parts, bar, short, tight) for bar, short, tight in
             ((True, False, False), (False, False, False), (False, True, False),
              (False, True, True))]     # tight: at 80x24 the short form lost its "ms"
    forms.append(_compact_words(r, parts))
    if r.prefill_preemptions:       # the note stays, the total gives way (the list has it)
        forms.append(_compact_words(r, parts, total=False))
    return next((f for f in forms if f.cell_len <= width), forms[-1])


def _compact_words(r, parts, total: bool = True) -> Text:
    """Two parts: the queue, and the chunks up to the first token together (vLLM's
    prefill_time): `TTFT 1430ms=queue 1397ms+4 chunks 152ms`. The 42-column panel of
    80x24 cut the tight form of a chunked prompt to `…+chunks 1-3 120ms+4→…`. Without
    the `total`, a prompt preempted in prefill keeps its note there: `queue 1397ms+4
    chunks 152ms, preempted ×1` (the note had wrapped onto a row the panel lacks)."""
    queued, prefill, last = parts
    n = r.prefill_chunks
    t = Text()
    if total:
        t.append(f"TTFT {fmt_ms(r.ttft)}", "bold")
        t.append("=")
    t.append("queue ")
    t.append(fmt_ms(queued), _color(PART_COLORS[0]))
    t.append("+dedup " if n == 0 else f"+{n} chunk{'' if n == 1 else 's'} ")
    t.append(fmt_ms(prefill + last), _color(PART_COLORS[1]))
    if r.prefill_preemptions:
        t.append(f" (preempted ×{r.prefill_preemptions})" if total else
                 f", preempted ×{r.prefill_preemptions}", "dim")
    return t


def _unfinished(r, now: float, until: str = "so far", width: int = 1000) -> Text:
    t = Text("TTFT: ", "bold")
    if r.scheduled_ts is None:
        if r.state not in ("waiting", "preempted"):
            return t.append("never scheduled", "dim")
        return t.append(f"queued {fmt_ms(now - r.arrival_time)} {until}", "dim")
    t.append(f"queued {fmt_ms(r.queued_time)}", _color(PART_COLORS[0]))
    # the chunks computed since its admission, as the request list's "chunk k/n"; a
    # chunk scheduled but not computed is in the step in flight (async scheduling)
    done, sent = r.chunks_done, r.prefill_chunks
    flight = ", 1 in flight" if sent - done == 1 and not r.preemptions else ""
    forms = [f", then {done} chunk{'' if done == 1 else 's'} computed {until}{flight}",
             f", {done} computed{flight}", f", {done} computed"]
    room = width - t.cell_len
    return t.append(next((f for f in forms if len(f) <= room), forms[-1]), "dim")


def _split_words(r, parts, bar: bool, short: bool, tight: bool = False) -> Text:
    """`tight`: no spaces around = and + (`TTFT 1430ms=queue 1397ms+1→token 32.2ms`)."""
    queued, prefill, last = parts
    n, plus = r.prefill_chunks, "+" if tight else " + "
    t = Text()
    t.append(f"TTFT {fmt_ms(r.ttft)}" + ("" if tight else " "), "bold")
    if bar:
        t.append_text(split_bar(parts, 8))
        t.append(" ")
    t.append("queue " if bar else "=queue " if tight else "= queue ")
    t.append(fmt_ms(queued), _color(PART_COLORS[0]))
    if n == 0:                      # a dedup follower: the leader computed its prompt
        t.append(f"{plus}leader's prefill ")
        t.append(fmt_ms(prefill), _color(PART_COLORS[1]))
        t.append(" (dedup)", "dim")
    else:
        if n > 1:                   # one chunk: scheduled and computed at once
            t.append(f"{plus}chunk{'s 1-' if n > 2 else ' '}{n - 1} ")
            t.append(fmt_ms(prefill), _color(PART_COLORS[1]))
        t.append(f"{plus}{n}→token " if short else f"{plus}chunk {n}→token ")
        t.append(fmt_ms(last), _color(PART_COLORS[2]))
    if r.prefill_preemptions:
        t.append(f" (preempted ×{r.prefill_preemptions}: chunks recomputed)", "dim")
    return t


def window_shares(requests, start: float) -> tuple[int, tuple[float, float, float] | None]:
    """(requests, each part's share of their summed TTFT) for the requests whose first
    token came at or after `start` (the TTFT row's); None shares when there is none."""
    rows = [p for p in (r.ttft_split() for r in window_firsts(requests, start)) if p]
    sums = [sum(x[i] for x in rows) for i in (0, 1, 2)]
    total = sum(sums)
    return len(rows), (tuple(s / total for s in sums) if rows and total > 0 else None)


def whole_percents(shares) -> list[int]:
    """Whole percents of `shares` (which add up to 1) that add up to 100: each rounded
    down, and the points left to the largest remainders, the first of a tie (rounded
    one by one, thirds read 33% 33% 33%)."""
    exact = [100 * s for s in shares]
    out = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(out)), key=lambda i: out[i] - exact[i])
    for i in by_remainder[:max(0, 100 - sum(out))]:
        out[i] += 1
    return out


def window_split(requests, start: float) -> Text:
    """"└ queue 83% prefill 12% last 5%": the Timing panel's line under TTFT."""
    _, shares = window_shares(requests, start)
    percents = whole_percents(shares) if shares else None
    t = Text(no_wrap=True)
    t.append("└ ", "dim")
    for word, key, i in (("queue", PART_COLORS[0], 0), ("prefill", PART_COLORS[1], 1),
                         ("last", PART_COLORS[2], 2)):
        t.append(f"{word} ", _color(key))
        t.append(f"{percents[i]}%" if percents else "-", "bold")
        t.append(" ")
    return t


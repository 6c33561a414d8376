"""The event log (COW, preemption, eviction, prefix hit, dedup join, chunk done) and
the KV map's flashes: blocks an event touched in the last FLASH_SECONDS of engine time
(paused: until the next step) get the event's colour and letter on the map.

Events come from `EngineSnapshot.events` (engine/snapshot.py: the most recent, oldest
first), so a replay shows exactly what was recorded.
"""
from __future__ import annotations

import textwrap
from functools import partial

from rich.text import Text
from textual.widget import Widget

from engine.codes import (EV_CHUNK_DONE, EV_COW, EV_DEDUP_JOIN, EV_EVICT, EV_OFFLOAD,
                          EV_PREEMPT, EV_PREFIX_HIT, EV_RELOAD, EV_SPEC_VERIFY, EV_SWAP_FALLBACK,
                          EV_SWAP_IN, EV_SWAP_OUT)
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.kv_map import COW, HIT, LETTER, PREEMPTED, ROLLBACK
from roseplay.tui.widgets.request_ids import short_id
from roseplay.tui.widgets.reshow import ReshownOnResize
from roseplay.tui.widgets.borders import WidthBorders
from roseplay.tui.widgets.stopped import STOP_STYLE, caption_borders

FLASH_SECONDS = 1.5
NO_EVENTS = ("no engine events yet: COW copies, preemptions, evictions, prefix hits, dedup "
             "joins and finished prefill chunks show here as they happen")
# evictions do not flash: once the pool is full nearly every allocation evicts a cached
# block, and a map of `E`s hides the rest; the legend and the log give their rate instead
FLASH = {EV_COW: COW, EV_PREEMPT: PREEMPTED, EV_PREFIX_HIT: HIT, EV_SPEC_VERIFY: ROLLBACK,
         EV_SWAP_OUT: PREEMPTED, EV_RELOAD: HIT, EV_SWAP_IN: HIT}
# routine once the pool is full (a step's evictions and their copies to the host tier):
# not listed one by one; the log's top line gives the eviction rate, the host map's line
# the copies of the last step
ROUTINE = (EV_EVICT, EV_OFFLOAD)
RATE_SECONDS = 1.0      # the log's eviction line: blocks evicted per second over this
LABEL = {EV_COW: ("COW", "cow"), EV_PREEMPT: ("preempt", "preempt"),
         EV_EVICT: ("evict", "evict"), EV_PREFIX_HIT: ("prefix hit", "hit"),
         EV_DEDUP_JOIN: ("dedup join", "shared"), EV_CHUNK_DONE: ("chunk done", "prefill"),
         EV_SPEC_VERIFY: ("spec verify", "decode"), EV_RELOAD: ("reload", "hit"),
         EV_SWAP_OUT: ("swap out", "preempt"), EV_SWAP_IN: ("swap in", "hit"),
         EV_SWAP_FALLBACK: ("no swap", "preempt")}
ID_NARROW, ID_WIDE = 8, 12      # the id column's cells (`w0kqf-10000` is 11)
WIDE_LOG = 90                   # a log this wide takes ID_WIDE


def flash_blocks(snap) -> dict[int, int]:
    """block -> event category for the recent events (later events win)."""
    out: dict[int, int] = {}
    for e in snap.events:
        cat = FLASH.get(e.kind)
        if cat is not None and snap.time - FLASH_SECONDS <= e.time <= snap.time + FLASH_SECONDS:
            out.update((b, cat) for b in e.blocks)
    return out


def eviction_rate(snap) -> float | None:
    """Blocks evicted per second over the last RATE_SECONDS of engine time (None: no
    eviction event among the snapshot's recent events)."""
    recent = [e for e in snap.events if e.kind == EV_EVICT]
    if not recent:
        return None
    since = snap.time - RATE_SECONDS
    return sum(len(e.blocks) for e in recent if e.time >= since) / RATE_SECONDS


def eviction_words(rate: float, room: int) -> str:
    """The eviction rate's line in whole words, the longest that fits `room` (the
    sentence was cut to `… reused for new tokens…` at 120x40)."""
    forms = (f"{rate:.0f} cached blocks/s reused for new tokens (routine once the pool "
             "is full)", f"{rate:.0f} cached blocks/s reused for new tokens",
             f"{rate:.0f} cached blocks/s reused", f"{rate:.0f} blocks/s")
    return next((f for f in forms if len(f) <= room), forms[-1])


def _blocks(blocks, most: int = 6) -> str:
    shown = " ".join(map(str, blocks[:most]))
    return shown + (f" …+{len(blocks) - most}" if len(blocks) > most else "")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def describe(e, room: int = 200) -> str:
    """What the event did, in words (without its step and kind), in `room` columns: the
    longest wording that fits, then as many of its blocks as fit."""
    b = e.blocks
    if e.kind == EV_COW:
        pairs = ", ".join(f"{b[i]}→{b[i + 1]}" for i in range(0, len(b) - 1, 2)[:4])
        forms = [f"copied shared block {pairs} before writing", f"copied {pairs} before "
                 f"writing", f"copied {pairs}"]
        return next((f for f in forms if len(f) <= room), forms[-1])
    words = {
        EV_PREEMPT: [f"out of blocks: freed {len(b)}, recomputes later",
                     f"freed {len(b)}, recomputes later", f"freed {len(b)}"],
        EV_EVICT: [f"reused {_n(len(b), 'cached block')}", f"reused {len(b)}"],
        EV_PREFIX_HIT: [f"prompt prefix: {_n(len(b), 'cached block')} reused",
                        f"{_n(len(b), 'cached block')} reused", f"{len(b)} reused"],
        EV_DEDUP_JOIN: [f"identical prompt: rides on {e.detail or 'its twin'}'s prefill",
                        f"rides on {e.detail or 'its twin'}'s prefill"],
        EV_CHUNK_DONE: [f"prefill chunk {e.detail}".strip(), f"chunk {e.detail}".strip()],
    }.get(e.kind, [e.detail or "", ", ".join((e.detail or "").split(", ")[:2])])
    text = next((f for f in words if len(f) <= room), words[-1])
    if e.kind in (EV_PREEMPT, EV_EVICT, EV_PREFIX_HIT):
        return _fit_blocks(text, b, room)
    return text


def _fit_blocks(words: str, blocks, room: int) -> str:
    """`words (b1 b2 …+n)` with the blocks that fit `room`; the words alone if none do."""
    for most in range(min(6, len(blocks)), 0, -1):
        text = f"{words} ({_blocks(blocks, most)})"
        if len(text) <= room:
            return text
    return words


class EventLog(ReshownOnResize, WidthBorders, Widget):
    """Newest first, one line each: step, kind (colour + word), request, what happened."""

    DEFAULT_CSS = "EventLog { height: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._key = None
        self._text = Text()

    def show(self, snap, stopped_at: int | None = None) -> None:
        """`stopped_at`: the step the engine stopped after (None while it serves): the
        log's top line says so in place of the eviction rate (nothing is evicted now)."""
        self.redraw_on_resize(partial(self.show, snap, stopped_at))
        key = (snap.events[-1] if snap.events else None, len(snap.events), self.size,
               theme.generation(), stopped_at)
        if key == self._key:
            return
        self._key = key
        self.set_borders(partial(caption_borders, stopped_at, ""))
        t = Text(no_wrap=True, overflow="ellipsis")
        rows = max(1, self.size.height)
        if stopped_at is not None:      # newest first: the stop, then what came before it
            rows -= 1
            t.append(f"#{stopped_at:<6}", "dim")
            t.append(f"■ {'stopped':<10}", STOP_STYLE)
            t.append(" the engine stopped after this step\n")
            if not snap.events:
                t.append("no engine event before it", "dim")
        elif not snap.events:
            t.append("\n".join(textwrap.wrap(NO_EVENTS, max(20, self.size.width))), "dim")
        evicted = eviction_rate(snap) if stopped_at is None else None
        if evicted is not None:
            rows -= 1
            t.append(f"{'now':<7}", "dim")
            t.append(f"  {'evict':<10}", f"bold {theme.color('evict')}")
            t.append(f" {eviction_words(evicted, self.size.width - 20)}\n")
        shown = [e for e in snap.events if e.kind not in ROUTINE]
        # a wide log (200x60, zoomed) has room for whole ids (`w0wuf-3165`: it read
        # `…wuf3165` beside 60 empty cells); a narrow one their short form
        idw = ID_WIDE if self.size.width >= WIDE_LOG else ID_NARROW
        for e in reversed(shown[-max(1, rows):]):
            word, color = LABEL.get(e.kind, (e.kind, "free"))
            t.append(f"#{e.step:<6}", "dim")     # 1-based (engine/core/stats.py)
            # the map's letter only where the event flashes blocks (a verify that
            # rejected no draft rolled nothing back: no R)
            letter = LETTER.get(FLASH.get(e.kind), " ") if e.blocks else " "
            t.append(f"{letter} {word:<10}", f"bold {theme.color(color)}")
            t.append(f" {short_id(e.request_id or '-', idw):<{idw}} ")
            t.append(describe(e, max(10, self.size.width - 21 - idw)) + "\n")
        t.rstrip()
        self._text = t
        self.refresh()

    def render(self) -> Text:
        return self._text

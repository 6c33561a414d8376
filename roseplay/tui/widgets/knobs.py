"""Knobs: the engine's live knobs and the workload, each with its key and current value.

Knob names, help texts, steps and minimums come from engine/config.py (field metadata);
their keys come from roseplay/tui/keys.py.
"""
from __future__ import annotations

import dataclasses
import textwrap

from rich.console import Group
from rich.text import Text
from textual.widget import Widget

from engine.config import KNOB_MAXIMUM, MAX_SPECULATIVE_TOKENS, SchedulerConfig, knob_fields
from roseplay.tui.keys import knob_key
from roseplay.workload.scenarios import SCENARIOS
from roseplay.tui.widgets.clip import clip_words
from roseplay.tui.widgets.guide_card import card_text
from roseplay.tui.widgets.knob_words import SHORT_NAMES, fmt_value

DOUBLING = ("max_num_batched_tokens",)    # keys double / halve these (512 -> 1024 -> ...)
WORKLOAD_HELP = {
    "concurrency": "Most requests the driver keeps in flight (closed loop, like vLLM's "
                   "--max-concurrency); a new one is sent as soon as one finishes.",
    "rate": "Request arrivals per second (Poisson); ∞ sends whenever a slot is free "
            "(r / R: next / previous).",
    "routing_policy": "Which replica serves a request (--data-parallel-size > 1; u / U): "
                      "round_robin in turn, least_load the least 4 x waiting + running, "
                      "consistent_hash by the prompt's first block, cache_aware the least "
                      "w x uncached + active blocks, cache_first the longest cached "
                      "prefix while the loads are even (docs/ROUTING.md).",
}
NARROW_NAMES = {**SHORT_NAMES, "enable_prefix_caching": "cache"}    # a narrow Knobs panel
# before any knob is turned: the longest that fits the panel's row whole (120x40 cut the
# first to "? explain… (? help)", 80x24 to "press a key to turn… (? help)")
FIRST_HINTS = ("press a key to turn a knob; ? explains every panel",
               "a key turns a knob · ? help")
MORE_HELP = " (? help)"     # after a cut help line: the help screen has it whole
CONCURRENCY_STEPS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# swap without a host tier: KVCacheManager.swap_out has nowhere to copy the blocks, so
# every swap preemption frees them and recomputes (engine/core/scheduler.py preempt)
NO_TIER_SWAP = ("swap recomputes: no host tier (--kv-offloading-size not set), "
                "so a preempted request's blocks are freed and computed again on "
                "re-admission, as under recompute; the event log says so each time.")


def live_fields() -> list[dataclasses.Field]:
    return [f for f in knob_fields(SchedulerConfig) if f.metadata.get("live")]


def knob_field(name: str) -> dataclasses.Field:
    return next(f for f in knob_fields(SchedulerConfig) if f.name == name)


def knob_bounds(name: str) -> tuple[int, int | None]:
    """[minimum, maximum] of an integer knob as engine/config.py defines them: the minimum
    in the field's metadata, the maximum in KNOB_MAXIMUM (num_speculative_tokens: in
    MAX_SPECULATIVE_TOKENS, the one home of k's limit); None: no maximum."""
    top = MAX_SPECULATIVE_TOKENS if name == "num_speculative_tokens" else KNOB_MAXIMUM.get(name)
    return knob_field(name).metadata.get("minimum", 1), top


def stepped(value: int, name: str, direction: int, upper: int | None = None) -> int:
    """The next value of an integer knob: DOUBLING knobs double / halve; others move by
    their metadata step, halving / doubling below it. Clamped to the knob's bounds
    (knob_bounds) and to `upper` where given."""
    step = knob_field(name).metadata.get("step", 1)
    minimum, top = knob_bounds(name)
    upper = min(x for x in (upper, top) if x) if (upper or top) else None
    if name in DOUBLING:
        new = value * 2 if direction > 0 else value // 2
    elif direction > 0:
        new = value * 2 if value < step else (value // step + 1) * step
    else:
        new = (value - 1) // step * step if value > step else value // 2
    new = max(minimum, new)
    return min(upper, new) if upper else new


def next_in(seq, value, direction: int):
    """The neighbour of `value` in a sorted sequence (clamped)."""
    seq = list(seq)
    if direction > 0:
        return next((v for v in seq if v > value), seq[-1])
    return next((v for v in reversed(seq) if v < value), seq[0])


def cycled(choices, current, direction: int, missing: int = -1):
    """The choice `direction` steps from `current` around `choices` (wrapping); a current
    value that is not a choice counts as standing at index `missing`."""
    choices = list(choices)
    i = choices.index(current) if current in choices else missing
    return choices[(i + direction) % len(choices)]


class KnobsPanel(Widget):
    """Current values; the help text of the last knob touched is shown underneath."""

    DEFAULT_CSS = "KnobsPanel { height: 12; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._content: tuple[Text, ...] = (Text(),)
        self.last_changed: str | None = None
        self.help_lines = 1
        self.host_tier = True       # the engine has a host KV tier (kv_offloading_size > 0)
        self._requested: SchedulerConfig | None = None
        self.guide_run = None       # a running guide: its scorecard replaces the knobs

    def show(self, requested: SchedulerConfig, applied: SchedulerConfig, workload: dict,
             read_only: bool = False, host_tier: bool = True) -> None:
        self.host_tier, self._requested = host_tier, requested
        if self.guide_run is not None:
            self._set_title(f"Guide {self.guide_run.guide.key} · scorecard")
            self._update((card_text(self.guide_run, self.size.width or 60,
                                    self.size.height or 10),))
            return
        self._set_title("Knobs")
        self._knob_rows(requested, applied, workload, read_only)

    def _set_title(self, title: str) -> None:
        if self.border_title != title:
            self.border_title = title

    def _update(self, content: tuple) -> None:
        if content != self._content:
            self._content = content
            self.refresh()

    def _knob_rows(self, requested: SchedulerConfig, applied: SchedulerConfig,
                   workload: dict, read_only: bool) -> None:
        rows = []
        for f in live_fields():
            value, now = getattr(requested, f.name), getattr(applied, f.name)
            key = knob_key(f.name) or ""
            rows.append((key, f.name, fmt_value(f.name, value),
                         "" if value == now else "  (from next step)"))
            if f.name == "preemption_mode" and value == now == "swap" and not self.host_tier:
                rows[-1] = (*rows[-1][:3], "  recomputes: no host tier")
        scen = workload.get("scenario") or "-"
        title = SCENARIOS[scen].title if scen in SCENARIOS else ""
        load = [("s", "scenario", scen, f"  {title}"),
                ("</>", "concurrency", f"{workload.get('concurrency') or '∞'}",
                 f"  in flight {workload.get('in_flight', 0)}")]
        rate = workload.get("rate")
        load.append(("r", "request rate", "∞" if rate is None else f"{rate:g}/s",
                     "  as fast as slots free" if rate is None else "  Poisson arrivals"))
        if workload.get("routing_policy"):      # data parallelism: the router's policy
            load.append(("u", "routing", workload["routing_policy"],
                         f"  {workload.get('replicas')} replicas"))
        # the panel's rows: a row each, or the workload on one where they do not all fit
        # (at 120x40 the request rate's row was cut off unsaid)
        height = self.size.height or len(rows) + len(load) + self.help_lines
        merged = len(rows) + len(load) > height
        rows += [] if merged else load
        width = max(len(r[2]) for r in rows) + 2      # values never run into their names
        short = self.size.width and self.size.width < width + 6 + 23    # short names fit
        if short:       # shorter values and names: "512 tok/step" left 9 columns for
            rows = [(k, n, v.replace(" tok/step", " tok"), note) for k, n, v, note in rows]
            width = max(len(r[2]) for r in rows) + 1        # "prefix cache" at 80x24
        room = (self.size.width or 200) - (6 + width + 23)     # what a note may take
        t = Text(no_wrap=True, overflow="ellipsis")
        for key, name, value, note in rows:     # a note is shown whole or not at all
            self._row(t, key, NARROW_NAMES.get(name, name) if short else name, value,
                      "" if short or len(note) > room else note, width)
        if merged:      # tight: "s mixed  </> 32  r ∞" in 80x24's 30 columns
            t.append(" ")
            for key, value, gap in merged_load(load, (self.size.width or 200) - 1):
                t.append(key, "bold reverse #5fb3f0")
                t.append(f" {value}{gap}", "bold #f2d34f")
        t.rstrip()
        lines = min(self.help_lines, height - len(rows) - merged)
        self._update((t, self._help_text(read_only, workload, lines, bool(short))))

    @staticmethod
    def _row(t: Text, key: str, name: str, value: str, note: str, width: int) -> None:
        """key | value | name | note: the value stays visible however narrow the panel."""
        t.append(f" {key:>3} ", "bold reverse #5fb3f0")
        color = "#4cc97a" if value == "ON" else "#ff6b6b" if value == "OFF" else "#f2d34f"
        t.append(f" {value:<{width}}", f"bold {color}")
        t.append(f"{name:<23}" if note else name)
        t.append(note + "\n", "dim")

    def _help_text(self, read_only: bool, workload: dict, room: int,
                   short: bool = False) -> Text:
        """The help line(s), wrapped to the panel's `room` lines left under the rows (none:
        the message line shows the same text); a cut text ends with "… (? help)".
        `short`: the rows show the short names, and so does the help (80x24's one line
        read `max_num_batched_toke… (? help)`: the name alone did not fit)."""
        if room <= 0:
            return Text()
        width = max(20, self.size.width or 60)
        text, name = self.help_line(read_only, workload), self.last_changed
        scenario = SCENARIOS.get(workload.get("scenario") or "")
        if short and name and text.startswith(f"{name}: "):
            text = NARROW_NAMES.get(name, name) + text[len(name):]
        elif short and name == "scenario" and scenario is not None and not read_only:
            text = f"{scenario.name}: {scenario.description}"     # ("scenario… (? help)")
        lines = textwrap.wrap(text, width) or [""]
        if len(lines) > room:       # cut at a word (80x24 read "scheduling_mode: Wh…")
            lines = lines[:room]
            lines[-1] = clip_words(lines[-1], width - len(MORE_HELP), more=True) + MORE_HELP
        return Text("\n".join(lines), "dim italic", no_wrap=True, overflow="ellipsis")

    def help_line(self, read_only: bool, workload: dict, knobs=None) -> str:
        """The last changed knob's help; `knobs`: the values requested now (default: those
        last shown), which say whether swap runs without a host tier."""
        if read_only:
            return "replay: knobs show what was set while recording"
        name = self.last_changed
        scenario = SCENARIOS.get(workload.get("scenario") or "")
        if name == "scenario" and scenario is not None:     # the one running, not a list
            return f"scenario {scenario.name} ({scenario.title}): {scenario.description}"
        if name in WORKLOAD_HELP:
            return f"{name}: {WORKLOAD_HELP[name]}"
        if name == "preemption_mode" and not self.host_tier and \
                getattr(knobs or self._requested, name, "") == "swap":
            return NO_TIER_SWAP         # its start fits the panel's line
        if name:
            return f"{name}: {knob_field(name).metadata['help']}"
        width = self.size.width or 200
        return next((h for h in FIRST_HINTS if len(h) <= width), FIRST_HINTS[-1])

    def render(self) -> Group:
        return Group(*self._content)


def merged_load(load: list, width: int) -> list[tuple[str, str, str]]:
    """The workload's knobs on one line, (key, value, gap) each: two spaces apart, else
    one, else the last ones left out whole (the routing policy first: the status line
    names it too). 80x24 with replicas cut it to `u…`."""
    items = [(key, value) for key, _, value, _ in load]
    while items:
        for gap in ("  ", " "):
            if sum(len(f"{k} {v}{gap}") for k, v in items) - len(gap) <= width:
                return [(k, v, gap) for k, v in items]
        items.pop()
    return []

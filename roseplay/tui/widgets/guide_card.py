"""The guide scorecard, drawn in the Knobs panel while a guide runs (roseplay/tui/guides/run.py):
the guide and its setup, whether its window is clean yet, each number its claim names
with what the claim expects, what the window measured and the verdict, what to watch,
and how to measure the other side of a comparison."""
from __future__ import annotations

import textwrap

from rich.text import Text

from roseplay.tui.guides.catalog import find, turn_hint
from roseplay.tui.guides.run import versus_name
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.knob_words import SHORT_NAMES, fmt_value

MARK = {True: ("✓", "tput"), False: ("✗", "preempt"), None: ("…", "free")}
LEGENDS = ("the claim, measured (✓ holds, ✗ does not, … not yet):",
           "the claim: ✓ holds, ✗ does not, … not yet")


def card_text(run, width: int, rows: int) -> Text:
    """At most `rows` lines of `width`: status first, then the verdicts, then the rest."""
    g = run.guide
    width = max(20, width)
    # the setup the engine runs: the versus's while the run measures it (guide 5's head
    # read "prefix cache ON" while guide 6's cache-off setup ran)
    setup = find(g.versus) if getattr(run, "measuring_versus", False) else g
    t = Text(no_wrap=True, overflow="ellipsis")
    lines: list[tuple[str, str]] = []

    def add(text: str, style: str = "", wrap: int = 1) -> None:
        wrapped = textwrap.wrap(text, width) or [""]
        if len(wrapped) > wrap:     # what is left out is said to be: "queue" read whole
            wrapped[wrap - 1] = wrapped[wrap - 1][:width - 1] + "…"
        for line in wrapped[:wrap]:
            lines.append((line, style))
    knobs = ", ".join(f"{SHORT_NAMES.get(k, k)} {fmt_value(k, v)}"      # (7, 8: "random ·  ·")
                      for k, v in setup.knobs.items()) or "default knobs"
    rest_of_head = f" · {setup.concurrency or 16} in flight" + \
        (f" · routing {setup.routing}" if setup.routing else "")
    narrow = width < 50         # 80x24: the verdicts before anything that can wait
    # narrow: the knobs first, so the setup's own knob is on the first line (guide 9's
    # "queue priority" was wrapped off, the line read "guide 9: mixed · queue")
    name = f"guide {g.key}" if setup is g else f"guide {g.key}, now {versus_name(setup.key)}"
    head = (f"{name}: {knobs} · {setup.scenario}" if narrow else
            f"{name}: {setup.scenario} · {knobs}") + rest_of_head
    marks = []
    for claim, ok in run.rows():
        mark, color = MARK[ok]
        marks.append((f"{mark} {claim}", f"bold {theme.color(color)}"))
    # every verdict in view: a narrow card short of rows gives the head, then the status
    # one line each (80x24's 10 rows cut guide 1's fourth verdict)
    marked = sum(min(2, len(textwrap.wrap(text, width))) for text, _ in marks)
    head_rows = status_rows = 2
    if narrow and 4 + marked > rows:
        head_rows, status_rows = 1, 1 if 3 + marked > rows else 2
    add(head, "bold", head_rows)
    add(run.status(), "italic", status_rows)
    if not narrow:      # the legend whole, in the longest form that fits (never cut)
        add(next(f for f in LEGENDS if len(f) <= width or f is LEGENDS[-1]), "dim")
    hint = run.versus_hint(turn_hint(g))
    rest = [(f"watch: {g.watch}", "dim")]
    if hint:
        rest.insert(0, (hint, ""))
    rest.append(("a knob key leaves the guide; its results stay", "dim"))
    for text, style in marks:
        add(text, style, 2)
    for text, style in rest:
        add(text, style, 3)
    for i, (line, style) in enumerate(lines[:max(1, rows)]):
        t.append(("\n" if i else "") + line, style)
    return t

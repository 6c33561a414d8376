"""Which panels fit the terminal, and how tall each is: decided by size, and said.

`plan(width, height)` keeps the panels a learner needs most (KV map, requests, the
selected request's text, timing figures), then adds the others while they fit; what did
not fit is listed in the message line above the footer ("press z to zoom"), which also
shows the app's messages (never a toast over a panel). `z` zooms one panel to the
whole screen (the only way to see a hidden one at a small size).
"""
from __future__ import annotations

from dataclasses import dataclass

TITLES = {"kv": "KV cache", "step": "This step", "strip": "Steps", "knobs": "Knobs",
          "requests": "Requests", "detail": "Selected request", "routing": "Routing",
          "events": "Events", "timing": "Timing"}
LEFT = ("kv", "step", "strip", "knobs")
RIGHT = ("requests", "detail", "routing", "events", "timing")
ZOOM_ORDER = ("kv", "requests", "events", "timing", "step", "strip", "knobs", "detail",
              "routing")
STATS_WIDTH, PLOT_MIN = 34, 56       # timing: the table, a plot of 40 points + its labels
TIMING_ROWS = {"stats": 8, "stacked": 16, "side": 10}   # plots: a time axis + 7 rows
KV_MIN, STEP_ROWS, KNOBS_ROWS, DETAIL_ROWS, REQUESTS_MIN, EVENTS_MIN = 9, 7, 12, 5, 6, 6
STRIP_ROWS = 6                       # the step strip: two bar rows, two (three) lines of numbers
WIDE = 110


@dataclass(frozen=True)
class Plan:
    heights: dict              # shown panel id -> rows (None: what is left, 1fr)
    left_width: int            # 0: the left column is hidden (a right panel is zoomed)
    timing: str                # "side" (plots beside the table), "stacked", "stats" (no plots)
    knob_help_lines: int
    note: str                  # what the layout hid, or the zoom; "" when all is shown


def _timing_mode(inner_width: int) -> str:
    return "side" if inner_width >= STATS_WIDTH + 2 + PLOT_MIN else "stacked"


def plan(width: int, height: int, zoom: str | None = None, extra_rows: int = 0,
         routing_rows: int = 0, typing: bool = False) -> Plan:
    """`extra_rows`: rows taken by something else (the open prompt box); `routing_rows`:
    the routing card's (data parallelism; 0: no card); `typing`: a text field has the
    keys (the prompt box), so z and ? type into it and the note says Esc first (it said
    `z zooms a panel · ? help` over a footer reading `f1 Help`)."""
    rows = height - 3 - extra_rows       # the status line, the message line, the footer
    esc = "Esc, then " if typing else ""
    if zoom in TITLES:
        mode = _timing_mode(width - 4) if zoom == "timing" else "side"
        note = (f"zoom: {TITLES[zoom]} · {esc}z next panel · Z all panels")
        return Plan({zoom: None}, width if zoom in LEFT else 0, mode, 3, note)
    left_width = max(40, round(width * 0.45)) if width >= WIDE else round(width * 0.42)
    filled = _fill(width - left_width, rows, left_width, routing_rows)
    if not filled[1]:
        return _plan(filled, left_width, "")
    note = f"hidden at {width}×{height}: {', '.join(filled[1])}"
    # each hint where it fits the line whole (its padding: 2); at 80x24 "· ? help" was cut
    # to "· ?"
    for hint in (f" · {esc}z zooms a panel", "" if typing else " · ? help"):
        if hint and len(note + hint) + 2 <= width:
            note += hint
    return _plan(filled, left_width, note)


def _plan(filled, left_width: int, note: str) -> Plan:
    heights, _, timing, help_lines = filled
    return Plan(heights, left_width, timing, help_lines, note)


def _fill(right_width: int, rows: int, left_width: int, routing_rows: int = 0):
    heights: dict = {"kv": None, "requests": None}
    hidden: list[str] = []
    # left column: the map first, then knobs, this step, the step strip; spare rows go
    # to knob help
    left = rows - KV_MIN
    for pid, need in (("knobs", KNOBS_ROWS), ("step", STEP_ROWS), ("strip", STRIP_ROWS)):
        if left >= need and not hidden:
            heights[pid], left = need, left - need
        else:
            hidden.append(TITLES[pid])
    help_lines = 1
    if "knobs" in heights and left >= 2 + 8:    # keep 8 spare rows for the map itself
        heights["knobs"], help_lines, left = KNOBS_ROWS + 2, 3, left - 2
    if "strip" in heights and left >= 1 + 8:    # the strip's speculation line
        heights["strip"] = STRIP_ROWS + 1
    # right column: requests, the selected text (and how it was routed), timing figures,
    # events, then plots
    right, cut = rows - REQUESTS_MIN, False
    routing = (("routing", routing_rows),) if routing_rows else ()
    for pid, need in (("detail", DETAIL_ROWS), *routing, ("timing", TIMING_ROWS["stats"]),
                      ("events", EVENTS_MIN)):
        cut = cut or right < need
        if cut:
            hidden.append(TITLES[pid])
        else:
            heights[pid], right = need, right - need
    timing = "stats"
    if "timing" in heights:
        mode = _timing_mode(right_width - 4)
        grow = TIMING_ROWS[mode] - TIMING_ROWS["stats"]
        if right >= grow:
            heights["timing"], right, timing = TIMING_ROWS[mode], right - grow, mode
        else:
            hidden.append("timing plots")
    if "detail" in heights and right >= 2:     # a row for the TTFT split (requests: 1 less)
        heights["detail"], right = DETAIL_ROWS + 1, right - 1
    if "events" in heights:
        more = max(0, min(4, right - 6))       # events grow while requests keep 12 rows
        heights["events"] += more
    return heights, hidden, timing, help_lines

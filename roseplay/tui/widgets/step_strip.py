"""Steps: the last engine steps side by side, so the step composition is read as numbers
rather than a 70 ms flicker of *This step*.

One column a step (the newest on the right), two rows of eighth-block bars: decode
tokens at the bottom, prefill tokens on top, the full height the most tokens a step of
the strip computed (the panel's subtitle says how many, and the budget). Under the
bars, over the same steps: how many mixed decodes and prefill, prefill
only or decode only (what `m` changes), the budget's use and its value (`+`/`-`, guides
1 and 2), the prefill chunks per prompt of the requests whose first token came in those
steps (RequestView.prefill_chunks), and speculative decoding's drafts when it ran. A
column whose budget or mode differs from the step before it is marked (a knob changed).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import zip_longest

from rich.text import Text
from textual.widget import Widget

from roseplay.tui.widgets import theme
from roseplay.tui.widgets.reshow import ReshownOnResize

STRIP_MAX = 120        # steps drawn at most (a wide panel); the numbers cover those drawn
BAR_ROWS = 2
_EIGHTHS = " ▁▂▃▄▅▆▇█"
EMPTY_BG, MARK_BG = "#1d2027", "#5a4a10"


@dataclass(frozen=True)
class StripNumbers:
    steps: int
    mixed: int                 # steps with decodes and prefill chunks
    prefill_only: int
    decode_only: int
    decode_tokens: int
    prefill_tokens: int
    budget_use: float | None   # mean of (decode + prefill) / budget over the steps
    budgets: tuple             # the (budget, mode) pairs in the window, oldest first
    prompts: int               # requests whose first token came in the window
    chunks: int                # their prefill chunks before the first token
    verified: int              # speculative decoding: requests verified with drafts,
    drafted: int               # the drafts, and those accepted
    accepted: int
    spec_off: int = 0          # steps disable_by_batch_size left without drafts
    drafted_by_pos: tuple = ()   # by draft position: verifies with a draft there, and
    accepted_by_pos: tuple = ()  # those that accepted it (and every draft before it)


def window_steps(snap, width: int) -> tuple:
    """The steps one column each fits, newest last."""
    n = max(0, min(width, STRIP_MAX))
    return snap.recent_steps[-n:] if n else ()


def strip_numbers(snap, steps) -> StripNumbers:
    """What the strip says under the bars, from the snapshot's steps and requests."""
    mixed = sum(1 for s in steps if s.decode_tokens and s.prefill_tokens)
    prefill_only = sum(1 for s in steps if s.prefill_tokens and not s.decode_tokens)
    uses = [(s.decode_tokens + s.prefill_tokens) / s.budget for s in steps if s.budget]
    budgets: list = []
    for s in steps:
        if not budgets or budgets[-1] != (s.budget, s.mode):
            budgets.append((s.budget, s.mode))
    start = steps[0].wall_time - steps[0].duration if steps else snap.time
    firsts = [r for r in snap.requests if r.ttft is not None and r.prefill_chunks
              and r.arrival_time + r.ttft >= start]
    return StripNumbers(
        len(steps), mixed, prefill_only, len(steps) - mixed - prefill_only,
        sum(s.decode_tokens for s in steps), sum(s.prefill_tokens for s in steps),
        sum(uses) / len(uses) if uses else None, tuple(budgets), len(firsts),
        sum(r.prefill_chunks for r in firsts), sum(s.spec_verified for s in steps),
        sum(s.spec_draft_tokens for s in steps), sum(s.spec_accepted_tokens for s in steps),
        sum(1 for s in steps if s.spec_off), *by_position(steps))


def by_position(steps) -> tuple[tuple, tuple]:
    """The steps' per-position draft counts summed: (drafted, accepted) by position."""
    def summed(rows) -> tuple:
        return tuple(map(sum, zip_longest(*rows, fillvalue=0)))
    return (summed(s.spec_drafted_per_pos for s in steps),
            summed(s.spec_accepted_per_pos for s in steps))


def bar_cell(decode: int, total: int, row: int) -> tuple[str, str, str]:
    """(character, foreground colour key, background) of one bar cell; `decode` and
    `total` in eighths of the bar's height, row 0 at the bottom."""
    lo, hi = row * 8, row * 8 + 8
    if total <= lo:
        return " ", "decode", EMPTY_BG
    if decode >= hi:
        return "█", "decode", EMPTY_BG
    if decode > lo:     # decode ends in this cell: prefill (if any) shows behind its top
        return _EIGHTHS[decode - lo], "decode", "prefill" if total > decode else EMPTY_BG
    if total >= hi:
        return "█", "prefill", EMPTY_BG
    return _EIGHTHS[total - lo], "prefill", EMPTY_BG


def _eighths(tokens: int, top: int) -> int:
    """A step's tokens in eighths of the bar (at least one when there are any)."""
    full = BAR_ROWS * 8
    return min(full, max(1 if tokens else 0, round(tokens / max(1, top) * full)))


def bar_top(steps) -> int:
    """The bars' full height: the most tokens a step of the strip computed."""
    return max((s.decode_tokens + s.prefill_tokens for s in steps), default=0)


def bar_rows(steps) -> list[Text]:
    """The bars, top row first; a column whose knobs changed has the mark background."""
    rows = [Text(no_wrap=True) for _ in range(BAR_ROWS)]
    top, prev = bar_top(steps), None
    for s in steps:
        d = _eighths(s.decode_tokens, top)
        t = _eighths(s.decode_tokens + s.prefill_tokens, top)
        knobs = (s.budget, s.mode)
        mark = prev is not None and knobs != prev
        prev = knobs
        for i, row in enumerate(rows):
            char, fg, bg = bar_cell(d, t, BAR_ROWS - 1 - i)
            bg = theme.color(bg) if bg in ("decode", "prefill") else bg
            row.append(char, f"{theme.color(fg)} on {MARK_BG if mark and char == ' ' else bg}")
    return rows


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


def budget_words(n: StripNumbers, snap) -> str:
    """"512", "512 → 32" after a change, the mode named unless it is the default."""
    pairs = n.budgets[-3:] or ((snap.knobs.max_num_batched_tokens, snap.knobs.scheduling_mode),)
    name_mode = len({m for _, m in pairs}) > 1 or pairs[-1][1] not in ("budget", "")
    return " → ".join(f"{b or '?'}{f' {m}' if name_mode else ''}" for b, m in pairs)


def budget_line(n: StripNumbers, snap, width: int = 0) -> Text:
    """`budget 512 used 5% · 1.0 chunks/prompt (9)`, or the longest shorter form that
    fits `width` (0: any): with a mode named it wrapped at 120x40, leaving `· 1.0`."""
    words = budget_words(n, snap)
    use = f"{100 * n.budget_use:.0f}%" if n.budget_use is not None else ""
    used, short = (f" used {use}", f" {use}") if use else ("", "")
    num = f"{n.chunks / n.prompts:.1f}" if n.prompts else ""
    forms = [("budget ", used, f" chunks/prompt ({n.prompts})"),
             ("budget ", used, " chunks/prompt"), ("budget ", used, " per prompt"),
             ("", short, " chunks/prompt"), ("", short, " per prompt")]
    if not n.prompts:
        forms = [("budget ", used, "no first token in these steps"),
                 ("", short, "no first token in these steps"), ("", short, "no first token")]
    pre, use_s, tail = next((f for f in forms if not width or len(f[0]) + len(words)
                             + len(f[1]) + 3 + len(num) + len(f[2]) <= width), forms[-1])
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(pre)
    t.append(words, "bold")
    t.append(f"{use_s} · ")
    t.append(num, "bold")
    return t.append(tail, "" if n.prompts else "dim")


def number_lines(n: StripNumbers, snap, wide: bool, width: int = 0) -> list[Text]:
    """The numbers under the bars: composition, budget and chunks per prompt, then
    speculative decoding (while it is on or ran in these steps)."""
    first = Text(no_wrap=True, overflow="ellipsis")
    first.append(f"{n.steps} steps: ")
    first.append(f"mixed {n.mixed}", "bold")
    first.append(f", prefill-only {n.prefill_only}, decode-only {n.decode_only}")
    if wide:
        first.append(f"  ({_share(n.mixed, n.steps)} mixed; a step: decode "
                     f"{n.decode_tokens / max(1, n.steps):.1f} + prefill "
                     f"{n.prefill_tokens / max(1, n.steps):.1f} tokens)", "dim")
    lines = [first, budget_line(n, snap, width)]
    if n.verified or snap.knobs.num_speculative_tokens:
        lines.append(spec_line(n, snap, width))
    return lines


def spec_line(n: StripNumbers, snap, width: int = 0) -> Text:
    """The steps' drafts, acceptance by position and the off-switch, the longest form
    that fits `width` (0: any): at 160x48 it wrapped, leaving `in 426 verifies ·`."""
    k, share = snap.knobs.num_speculative_tokens, _share(n.accepted, n.drafted)
    heads = [f"spec {snap.spec_method or '?'} k={k}: ", f"spec k={k}: "]
    counts = [f"{n.drafted} drafted → {n.accepted} accepted ({share}) in {n.verified} verifies",
              f"{n.drafted} → {n.accepted} accepted ({share})", f"{n.drafted} → {n.accepted} ({share})"]
    pos = " ".join(f"{100 * a / d:.0f}" for d, a in zip(n.drafted_by_pos, n.accepted_by_pos)
                   if d) + "%" if n.drafted_by_pos else ""   # vLLM's per-position acceptance
    offs = ([f" · off in {n.spec_off} steps (> disable_by_batch_size "
             f"{snap.spec_disable_by_batch_size} decoding)", f" · off in {n.spec_off} steps", ""]
            if n.spec_off else [""])
    # shorter counts and head first, then the off-switch's words, then the positions
    forms = [(h, c, p, o) for p in ([pos, ""] if pos else [""]) for o in offs
             for c in counts for h in heads]
    size = (lambda f: len(f[0]) + len(f[1]) + (len(f[2]) + 9 if f[2] else 0) + len(f[3]))
    head, count, by, off = next((f for f in forms if not width or size(f) <= width),
                                min(forms, key=size))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(head, "bold")
    t.append(count)
    if by:
        t.append(" · by pos ")
        t.append(by, "bold")
    return t.append(off, theme.color("prefill"))


class StepStrip(ReshownOnResize, Widget):
    """The last steps as columns of decode / prefill tokens, and their numbers."""

    DEFAULT_CSS = "StepStrip { height: 6; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()
        self._key = None

    def show(self, snap) -> None:
        self.redraw_on_resize(partial(self.show, snap))
        key = (snap.last_step, snap.knobs, self.size, theme.generation(), snap.spec_method)
        if key == self._key:
            return
        self._key = key
        self._text = self.build(snap)
        steps = window_steps(snap, self.size.width)
        subtitle = (f"full height {bar_top(steps)} tok · budget "
                    f"{snap.knobs.max_num_batched_tokens}") if steps else ""
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle
        self.refresh()

    def build(self, snap) -> Text:
        width, height = self.size.width, self.size.height
        steps = window_steps(snap, width)
        t = Text(no_wrap=True, overflow="ellipsis")
        if not steps:
            return t.append("no step yet: the engine is waiting for requests", "dim")
        for row in bar_rows(steps):
            t.append_text(row)
            t.append("\n")
        lines = number_lines(strip_numbers(snap, steps), snap, wide=width >= 90, width=width)
        room = max(1, height - BAR_ROWS)
        t.append_text(Text("\n").join(lines[:room]))
        if height > BAR_ROWS + len(lines):       # zoomed: what the bars are
            t.append("\n")
            t.append_text(legend(width))
        return t

    def render(self) -> Text:
        return self._text


# what the bars are, longest first: the longest that fits the panel's width whole (at
# 200x60 the first was cut to "… full height = the most", unsaid)
LEGENDS = ((" prefill tokens, a column a step (newest right), full height = the most "
            "tokens a step here computed; ", " budget or mode changed"),
           (" prefill tokens, a column a step (newest right); ", " budget or mode changed"),
           (" prefill, a step a column; ", " knob changed"))


def legend(width: int = 200) -> Text:
    for words, mark in LEGENDS:
        if len("█ decode  █") + len(words) + 2 + len(mark) <= width or mark is LEGENDS[-1][1]:
            break
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("█", theme.color("decode"))
    t.append(" decode  ")
    t.append("█", theme.color("prefill"))
    t.append(words)
    t.append("  ", f"on {MARK_BG}")
    t.append(mark, "dim")
    return t

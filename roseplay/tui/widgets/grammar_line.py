"""A constrained request's grammar in the Selected panel (docs/STRUCTURED_OUTPUTS.md
"Shown live"): its last step's mask, from the engine's GrammarView.

    grammar json · in string · 3,811/4,096 allowed (93%) · took '{'
    model's top: ' the' 31% ✗  '\\n' 12% ✗  '{' 2% ✓      (✗: struck out by the mask)

The first line is how many tokens the grammar allowed and its state in words; the second
the model's own top choices before the mask, the ones the mask struck out crossed (and
marked ✗, so a plain-text screen says it too): what remains of them is the choice after
the mask, and the token taken is among it. A request waiting for its grammar says so;
one that asked for no logprobs has no per-step view (the engine traces only those).
"""
from __future__ import annotations

import math

from rich.text import Text

from roseplay.tui.widgets.token_choice import pct, token_label

GRAMMAR_STYLE = "#56b6c2"
NO_VIEW = "its mask shows for a request that asks for logprobs (a typed prompt does)"


def grammar_rows(g, lines: int) -> int:
    """Rows the grammar takes in a panel of `lines` (0: a free request)."""
    if g is None:
        return 0
    return 2 if lines >= 10 and g.allowed >= 0 else 1


def head_text(g, tokenizer, brief: bool = False) -> Text:
    """`brief`: without the share and the compile note's why, for a narrow panel."""
    t = Text()
    t.append(f"grammar {g.kind}", f"bold {GRAMMAR_STYLE}")
    if g.state == "compiling":
        return t.append(" · compiling" + ("" if brief else
                                          " (the request waits for it, not in the queue)"), "dim")
    if g.allowed < 0:
        return t.append(f" · {NO_VIEW}", "dim")
    share = g.allowed / g.vocab if g.vocab else 0.0
    t.append(f" · {g.state} · ", "")
    t.append(f"{g.allowed:,}/{g.vocab:,} allowed", "bold")
    if not brief:
        t.append(f" ({pct(share)})", "dim")
    if g.token >= 0:
        t.append(" · took ", "dim")
        t.append(token_label(g.token, tokenizer), "bold")
    return t


def top_text(g, tokenizer, width: int) -> Text:
    """The model's top choices, the masked ones struck out (as many as fit `width`)."""
    t = Text()
    t.append("model's top:", "dim")
    for i, (token, logprob, allowed) in enumerate(g.top):
        mark = "✓" if allowed else "✗"
        piece = f"{' ' if i == 0 else '  '}{token_label(token, tokenizer)} " \
                f"{pct(math.exp(logprob))} {mark}"
        if t.cell_len + len(piece) + 2 > width:
            return t.append(" …", "dim")
        style = ("bold " if token == g.token else "") + ("" if allowed else "strike dim")
        t.append(piece, style.strip())
    return t


def grammar_text(g, tokenizer, rows: int, width: int = 200) -> Text:
    """`rows` 1: the head, then the top choices as far as the line goes; 2: a line each.
    Each line fits `width`: a longer one wrapped onto the panel's next row, which pushed
    the head's `took` and the next-token line out of a 120x40 panel."""
    t = head_text(g, tokenizer)
    if t.cell_len > width:
        t = head_text(g, tokenizer, brief=True)
    if g.allowed >= 0 and g.top and rows >= 1:
        if rows > 1:
            t.append("\n").append_text(top_text(g, tokenizer, width))
        elif t.cell_len + len(" · model's top: …") <= width:
            t.append(" · ").append_text(top_text(g, tokenizer, width - t.cell_len))
    lines = t.split("\n")
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)

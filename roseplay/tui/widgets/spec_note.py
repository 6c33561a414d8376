"""Speculative decoding where its effect shows: the method and the live k, and why ITL
turns bursty under it (one line under the ITL plot of the Timing panel).

A verify step emits the accepted drafts and the target's next token together, at one
time: their inter-token gaps are exactly 0 (engine/request.py append_sampled stamps a
step's tokens with one time), and the rest of each burst's wait lands on the gap before
it. The line gives the share of 0 ms gaps and the tokens per verify (vLLM's mean
accepted length) over the Timing panel's window, from the engine's data.
"""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from roseplay.tui.widgets import theme


def spec_label(snap) -> str:
    """"ngram k=3" (the method of the engine's speculative_config, the live k)."""
    return f"{snap.spec_method or '?'} k={snap.knobs.num_speculative_tokens}"


def burst_numbers(snap, start: float, window=None) -> tuple[int, int, int, int]:
    """(gaps, gaps of 0 s, verifies, accepted drafts) since `start` (engine time), of the
    gaps and steps `window` (a CounterWindow: the Timing table's) kept, else of the
    snapshot's latest."""
    gaps = [g for t, g in (snap.recent_itls if window is None else window.itls())
            if t >= start]
    steps = [s for s in (snap.recent_steps if window is None else window.steps())
             if s.wall_time >= start]
    return (len(gaps), sum(1 for g in gaps if g == 0.0), sum(s.spec_verified for s in steps),
            sum(s.spec_accepted_tokens for s in steps))


def burst_text(snap, start: float, window=None) -> Text | None:
    """The ITL plot's note while speculation is on or ran in the window; None else."""
    gaps, zero, verifies, accepted = burst_numbers(snap, start, window)
    k = snap.knobs.num_speculative_tokens
    if not k and not verifies:
        return None
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"spec {spec_label(snap)}: ", f"bold {theme.color('decode')}")
    if snap.spec_pause:       # the off-switch: a plain decode step (disable_by_batch_size)
        return t.append(f"{snap.spec_pause}, ITL as without it", "dim")
    if not verifies:
        return t.append("no verify in the last 10 s, ITL as without it", "dim")
    t.append(f"{1 + accepted / verifies:.1f}", "bold")
    t.append(" tok/verify at once → ")
    t.append(f"{100 * zero / max(1, gaps):.0f}%", "bold")
    t.append(" of ITL gaps 0 ms")
    return t


class SpecNote(Widget):
    """One line under the ITL plot (hidden while speculation is off and idle)."""

    DEFAULT_CSS = "SpecNote { height: 1; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()
        self.display = False

    def show(self, snap, start: float, window=None) -> None:
        text = burst_text(snap, start, window)
        if (text is not None) != self.display:
            self.display = text is not None
        if text is not None and text != self._text:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text

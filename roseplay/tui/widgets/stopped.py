"""Words the panels use once the engine has stopped for good.

A stopped engine publishes nothing more: the snapshot on screen is the last one, true
as of its step and never of now. Panels then blank what describes now (rates, counts
of what runs), say how far an in-flight request got before the stop, and carry this
caption; the app hands them the step the engine stopped after (None while it serves).
"""
from __future__ import annotations

from roseplay.tui.widgets.borders import border_form, fits

BLANK = "—"                 # a figure about now: a stopped engine has none
CUT_OFF = "cut off"         # the state of a request the stop ended in flight
CUT_STYLE = "#c06060"       # its state and how far it got
STOP_STYLE = "bold #ff5555"  # the red of the top line's ■ STOPPED


def captions(step: int) -> tuple[str, ...]:
    """The caption of a panel that shows the last snapshot, longest form first."""
    return (f"as of step {step} · engine stopped", f"step {step} · engine stopped",
            f"stopped at {step}")


def with_caption(stopped_at: int | None, words: str, width: int = 1000,
                 keep_words: bool = False) -> str:
    """A border subtitle: the stop's caption first, then the panel's own words; where
    both do not fit, the caption alone (never a cut word after it), or the words alone
    with `keep_words` (a panel that says the stop elsewhere, and whose words must stay)."""
    if stopped_at is None:
        return words
    forms = captions(stopped_at)
    both = (f"{c} · {words}" for c in forms) if words else ()
    alone = words if keep_words and words else border_form(forms, width)
    return next((f for f in both if fits(f, width)), alone)


def caption_borders(stopped_at: int | None, words: str, width: int) -> tuple[None, str]:
    """A WidthBorders function for a panel whose subtitle is its words with the stop's
    caption, and whose title stays."""
    return None, with_caption(stopped_at, words, width)

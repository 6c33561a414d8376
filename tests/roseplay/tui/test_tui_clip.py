"""One word-cut for a line that goes on: the Knobs panel's help cut its last line with
a word-cut of its own, which kept one cell less than the shared `clip_words` (a word
ending at the 51st of 60 cells was dropped)."""
from __future__ import annotations

from roseplay.tui.widgets.clip import clip_words
from roseplay.tui.widgets.knobs import MORE_HELP, KnobsPanel


def test_clip_words_more_cuts_a_line_that_fits():
    assert clip_words("alpha beta", 20) == "alpha beta"
    assert clip_words("alpha beta", 20, more=True) == "alpha beta…"
    assert clip_words("alpha beta gamma", 12, more=True) == "alpha beta…"


def test_the_knobs_help_cut_keeps_a_word_that_fits():
    """An unmounted panel is 60 cells wide: a first line of 50 cells fits whole beside
    "… (? help)"."""
    panel = KnobsPanel()
    first = ("word " * 10).strip() + "x"        # 50 cells: its last word ends at cell 50
    panel.help_line = lambda read_only, workload: f"{first} and more words after it " * 3
    shown = panel._help_text(False, {}, 1).plain
    assert shown == f"{first}…{MORE_HELP}", shown
    assert len(shown) <= 60

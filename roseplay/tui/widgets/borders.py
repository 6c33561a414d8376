"""What fits in a panel's border: titles and subtitles come in several forms, longest
first, and a border shows the longest one that fits whole (never a cut word)."""
from __future__ import annotations


def fits(text: str, width: int) -> bool:
    """Whether a border title or subtitle fits a border of `width` cells (corners and
    padding spared)."""
    return len(text) + 6 <= width


def border_form(forms, width: int) -> str:
    """The first of `forms` (longest first) that fits a border of `width`, else the last."""
    return next((f for f in forms if fits(f, width)), forms[-1])

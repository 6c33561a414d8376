"""A one-line text cut to a width at a sentence's or a word's end, never inside a word
(the message line read `… Turning i…` at 120x40)."""
from __future__ import annotations


def clip_words(text: str, width: int, more: bool = False) -> str:
    """`text` whole when it fits; else its sentences that fit and " …", when they fill
    half the width at least; else its words that fit and "…". `more`: the text goes on
    past it (a wrapped line's last shown line): cut, with its "…", even where it fits."""
    if len(text) <= width and not more:
        return text
    text += " " if more else ""         # its last word ends there
    room = max(0, width - 2)
    sentence = text.rfind(". ", 0, room)
    if sentence + 1 >= width // 2:
        return text[:sentence + 1] + " …"
    word = text.rfind(" ", 0, width)
    return (text[:word].rstrip(" ,;:") if word > 0 else text[:max(0, width - 1)]) + "…"

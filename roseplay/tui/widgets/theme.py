"""Colour themes: the default one and a colour-blind-safe one (Okabe-Ito palette).

Widgets read colours through `color(name)` when they build their styles, and clear
their caches when `set_theme` bumps `generation`; letters on the KV map (C, P, E, H, R)
and words in the legend carry the same meaning as the colours, so no information is
in colour alone.
"""
from __future__ import annotations

THEMES = {
    "default": {
        "free": "#30343c", "used": "#2e9e5b", "cached": "#2f6db5", "shared": "#e08a1e",
        "selected": "#f2d34f", "cow": "#d65db1", "preempt": "#ff5555", "evict": "#8f6fd8",
        "hit": "#3fc1c9", "decode": "#4cc97a", "prefill": "#f2c14e", "tput": "#5fb3f0",
        "rollback": "#a3e635",
    },
    "colour-blind": {        # Okabe & Ito, "Color Universal Design"
        "free": "#3a3a3a", "used": "#0072b2", "cached": "#56b4e9", "shared": "#e69f00",
        "selected": "#f0e442", "cow": "#cc79a7", "preempt": "#d55e00", "evict": "#999999",
        "hit": "#009e73", "decode": "#0072b2", "prefill": "#e69f00", "tput": "#56b4e9",
        "rollback": "#e8e8e8",
    },
}
_state = {"name": "default", "generation": 0}


def color(name: str) -> str:
    return THEMES[_state["name"]][name]


def current() -> str:
    return _state["name"]


def generation() -> int:
    return _state["generation"]


def set_theme(name: str) -> None:
    if name not in THEMES:
        raise ValueError(f"unknown theme {name!r}; themes: {', '.join(THEMES)}")
    if name != _state["name"]:
        _state["name"] = name
        _state["generation"] += 1

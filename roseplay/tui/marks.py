"""The plot marks of knob changes: a change's short label (`budget 32`, `prefix cache
OFF`, `guide 3`), live and from a recording's events, one mark per user action."""
from __future__ import annotations

from roseplay.tui.widgets.knob_words import SHORT_NAMES
from roseplay.tui.widgets.knobs import live_fields


def change_label(source, knob: str) -> str:
    """`budget 32`, `prefix cache OFF`, `scenario mixed`: a knob's short name and new value."""
    if knob in {f.name for f in live_fields()}:
        return knob_label(knob, getattr(source.knobs, knob))
    return knob_label(knob, source.workload().get(knob))


def knob_label(knob: str, value) -> str:
    value = ("ON" if value else "OFF") if isinstance(value, bool) else value
    value = "∞" if value is None and knob == "rate" else value
    return f"{SHORT_NAMES.get(knob, knob)} {value}"


def event_label(event: dict) -> str | None:
    """The plot mark of a recorded event, as the live app labelled it (None: no mark):
    one knob set, a workload change, or a guide."""
    what = event.get("what")
    data = {k: v for k, v in event.items() if k not in ("kind", "t", "what")}
    if what == "guide":
        return f"guide {data.get('key', '?')}"
    if what == "knobs" and len(data) == 1:
        return knob_label(*next(iter(data.items())))
    if what in ("scenario", "concurrency", "rate") and what in data:
        return knob_label(what, data[what])
    if what == "routing":           # a data-parallel router's policy (u)
        return knob_label("routing_policy", data.get("policy"))
    return None


class RecordedMarks:
    """Plot marks from a recording's events, one per user action as the live app drew
    them: the changes a guide makes (recorded within GUIDE_SECONDS after its `guide`
    event) add none of their own."""
    GUIDE_SECONDS = 1.0

    def __init__(self):
        self._guide_t: float | None = None

    def label(self, event: dict) -> str | None:
        t = event.get("t", 0.0)
        if event.get("what") == "guide":
            self._guide_t = t
        elif self._guide_t is not None and 0 <= t - self._guide_t < self.GUIDE_SECONDS:
            return None
        return event_label(event)


def describe_event(event: dict) -> str:
    what = event.get("what", "?")
    data = {k: v for k, v in event.items() if k not in ("kind", "t", "what")}
    detail = ", ".join(f"{k}={v}" for k, v in data.items())
    return f"{event.get('t', 0):.1f} s: {what}{f' ({detail})' if detail else ''}"

"""The command palette (ctrl+p): every action of the current mode by name, plus typed
values: `max_num_seqs 32`, `budget 1024`, `cache off`, `concurrency 8`, `rate 5`,
`scenario identical`, `routing cache_aware`, `sort TTFT`, `filter decoding`, `zoom timing`, `speed 4`, `seek 30`.

Actions come from roseplay/tui/keys.py; knob values are parsed and checked with the CLI's
converters (roseplay/cli_flags.py: type and minimum from engine/config.py).
"""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from roseplay.tui.keys import for_mode
from roseplay.tui.layout import TITLES
from roseplay.workload.scenarios import SCENARIOS
from roseplay.tui.widgets.knobs import live_fields
from roseplay.tui.widgets.requests import FILTERS, SORTS

ALIASES = {"budget": "max_num_batched_tokens", "tokens": "max_num_batched_tokens",
           "seqs": "max_num_seqs", "cache": "enable_prefix_caching",
           "prefix": "enable_prefix_caching", "mode": "scheduling_mode",
           "policy": "scheduling_policy", "queue": "scheduling_policy",
           "eviction": "eviction_policy", "evict": "eviction_policy",
           "preempt": "preemption_mode", "preemption": "preemption_mode"}
WORKLOAD = ("concurrency", "rate", "scenario")
EXAMPLES = ("max_num_seqs 32", "budget 1024", "cache off", "mode prefill-first", "policy lpm",
            "evict lfu", "concurrency 8", "rate 5",
            "scenario identical", "routing cache_aware", "sort TTFT", "filter decoding",
            "zoom timing")


def typed_command(app, query: str, views: bool = True):
    """(title, callback) for a typed `NAME VALUE` query, or None; `views`: the request
    list and zoom exist (not on the compare screen)."""
    if query.lower().startswith("goodput"):
        text = query[len("goodput"):].strip()
        return f"goodput SLOs {text or '(clear)'}", partial(app.set_slos_text, text)
    parts = query.replace("=", " ").split()
    if len(parts) != 2:
        return None
    name, value = parts[0].lower(), parts[1]
    name = ALIASES.get(name, name)
    if name in {f.name for f in live_fields()} | set(WORKLOAD):
        return f"set {name} = {value}", partial(app.set_value, name, value)
    if not views:
        return None
    if name == "sort":
        key = next((k for k in SORTS if k.lower() == value.lower()), None)
        return (f"sort requests by {key}", partial(app.set_sort, key)) if key else None
    if name == "filter":
        state = next((f for f in FILTERS if f and f == value.lower()), None)
        if value.lower() in ("all", "none"):
            return "show all requests", partial(app.set_filter, None)
        return (f"show only {state} requests", partial(app.set_filter, state)) if state else None
    if name == "zoom":
        pid = next((p for p, t in TITLES.items() if value.lower() in (p, t.lower().split()[0])),
                   None)
        return (f"zoom {TITLES[pid]}", partial(app.set_zoom, pid)) if pid else None
    if name in ("routing", "route", "routing_policy"):
        return f"routing policy {value}", partial(app.set_routing, value)
    if name in ("speed", "seek") and app.source is not None and app.source.kind == "replay":
        return f"replay {name} {value}", partial(app.set_value, name, value)
    return None


class RoseplayCommands(Provider):
    """Actions (from roseplay/tui/keys.py) and typed knob / workload / view values."""

    VIEWS = True

    def _actions(self):
        app = self.app
        kind = app.source.kind if app.source is not None else "live"
        for k in for_mode(kind):
            if app.check_action(k.action.split("(")[0], ()):
                yield f"{k.help} ({k.display})", partial(app.run_action, k.action), k.label
        for name in SCENARIOS:
            yield f"scenario {name}", partial(app.set_value, "scenario", name), "workload"
        if not self.VIEWS:
            return
        for key in SORTS:
            yield f"sort requests by {key}", partial(app.set_sort, key), "requests"
        for state in FILTERS:
            yield (f"show only {state} requests" if state else "show all requests",
                   partial(app.set_filter, state), "requests")
        for pid, title in TITLES.items():
            yield f"zoom {title}", partial(app.set_zoom, pid), "layout"

    async def discover(self) -> Hits:
        for title, callback, group in self._actions():
            yield DiscoveryHit(title, callback, help=group)
        yield DiscoveryHit("type a value, e.g. " + " · ".join(EXAMPLES[:4]), lambda: None,
                           help="knobs and workload")

    async def search(self, query: str) -> Hits:
        typed = typed_command(self.app, query, self.VIEWS)
        if typed is not None:       # alone: a fuzzy match (the `c` toggle for `cache off`,
            yield Hit(1.0, typed[0], typed[1], help="press Enter to apply")   # `r` for
            return                  # `rate 5`) must never be what Enter runs
        matcher = self.matcher(query)
        for title, callback, group in self._actions():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=group)


class CompareCommands(RoseplayCommands):
    """The compare screen's palette: no request list, no zoom."""

    VIEWS = False

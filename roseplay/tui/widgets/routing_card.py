"""The routing card: for the selected request, what the data-parallel router weighed
(engine/front/router.py RouteDecision): per replica the prompt's blocks it held
(cache_aware, cache_first), the waiting, running and active blocks the router saw, each replica's
cost under the policy, and the winner with the router's own reason."""
from __future__ import annotations

import textwrap

from rich.text import Text

from roseplay.tui.widgets.text_view import TextView

# what each policy's cost column is (None: the policy weighs no cost)
COST_HEAD = {"least_load": "4w+r", "cache_aware": "cost", "cache_first": "4w+r"}
BLIND = {"round_robin": "blind to load and caches", "consistent_hash": "blind to load"}


def _cost(value: float) -> str:
    return "dead" if value == float("inf") else f"{value:g}"


def card_text(decision, request_id: str | None, width: int, kept: int = 0) -> Text:
    """The card of one RouteDecision (None: no decision kept for the request)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if request_id is None:
        t.append("select a request: where the router sent it, and why", "dim")
        return t
    if decision is None:
        t.append(f"{request_id}: no routing decision kept (the router keeps its last "
                 f"{kept}, the app the typed prompts' and those it showed)", "dim")
        return t
    d = decision
    t.append(f"{request_id} → replica {d.chosen}", "bold #f2d34f")
    t.append(f" · {d.policy}", "bold")
    why = f"why: {d.reason}" + (f" ({BLIND[d.policy]})" if d.policy in BLIND else "")
    lines = textwrap.wrap(why, max(20, width))
    t.append("\n" + lines[0])
    t.append("\n" + " ".join(lines[1:]), "")          # the reason's rest, or a blank row
    head = COST_HEAD.get(d.policy)
    cached = bool(d.cached_blocks)
    cols = (["cached"] if cached else []) + ["wait", "run", "active"] + ([head] if head else [])
    t.append("\n   " + "".join(f"{c:>7}" for c in cols), "dim")
    for r, load in enumerate(d.loads):
        cells = ([f"{d.cached_blocks[r]}/{d.prompt_blocks}"] if cached else []) + [
            str(load.waiting), str(load.running), str(load.active_blocks)] + (
            [_cost(d.costs[r])] if head else [])
        mark = "▶" if r == d.chosen else " "
        t.append(f"\n{mark}r{r}", "bold #f2d34f" if r == d.chosen else "bold")
        t.append("".join(f"{c:>7}" for c in cells),
                 "bold" if r == d.chosen else "" if load.alive else "dim strike")
    return t


def card_rows(replicas: int) -> int:
    """The Routing panel's height: its border, the winner, why (two rows), the header, a
    row each."""
    return 2 + 4 + replicas


class RoutingCard(TextView):
    """The Routing panel (shown with --data-parallel-size > 1)."""

    DEFAULT_CSS = "RoutingCard { height: 8; text-wrap: nowrap; text-overflow: ellipsis; }"

    def show_decision(self, decision, request_id: str | None, kept: int) -> None:
        self.show(card_text(decision, request_id, max(20, self.size.width), kept))

"""A request id in a narrow column: the short forms that keep ids apart (the request
list's id column, the event log's): past 9999 a workload id read `…-10000`, this app's
and another's alike, until 2026-11-29."""
from __future__ import annotations

from string import ascii_letters

from roseplay.workload.driver import PROCESS_TAG
from roseplay.workload.own_prompts import OWN_PREFIX, short_own_id

ID_WIDTH = 7            # the id column's narrowest (roseplay/tui/widgets/requests.py COLUMNS)


def short_id(request_id: str, width: int) -> str:
    """A request id in `width` cells: ids that differ only at the end (`cmpl-<tag><n>`
    from `roseplay serve`) keep their end, "…" standing for the common start; a typed
    prompt's keeps `you` and drops its process's tag (`you…-12`); a workload's keeps its
    process's tag and its whole counter (`…kqf-10000`, else `…kqf10000`: the tag is
    letters, the counter digits), so no two read alike past 9999."""
    if len(request_id) <= width:
        return request_id
    form = next((f for f in id_forms(request_id) if len(f) <= width), None)
    if form is not None:
        return form
    return "…" + request_id[len(request_id) - max(0, width - 1):] if width > 1 else "…"


def id_forms(request_id: str) -> list[str]:
    """The short forms of an id that keep what tells it apart, longest first: a workload
    id's tag and whole counter; where no tag fits, this process's own ids drop their tag
    (every row of this app's has it: `w0…10000`), and another process's keep its end."""
    if request_id.startswith(OWN_PREFIX):
        own = short_own_id(request_id)
        return [own, own.replace("…-", "…")] if own != request_id else []
    head, dash, n = request_id.rpartition("-")
    tag = head[len(head.rstrip(ascii_letters)):]
    if not (dash and tag and n.isdigit()):
        return []
    mine = [f"{head[:-len(tag)]}…{n}"] if tag == PROCESS_TAG else []
    return [f"…{tag}-{n}", f"…{tag}{n}", *mine]


def id_need(request_id: str) -> int:
    """The cells an id needs to read apart from the others: whole, else its longest
    short form (`…kqf-10000`), else the column's width."""
    if len(request_id) <= ID_WIDTH:
        return len(request_id)
    return len(next(iter(id_forms(request_id)), "")) or ID_WIDTH

"""Request list (Line API, sticky header, own cursor); the selected request's text is
roseplay/tui/widgets/request_detail.py.

Rows are drawn by us instead of a DataTable (whose update_cell invalidates its whole
row cache): each visible line remembers the RequestView it drew, and a new snapshot
refreshes only the lines whose view changed (finished requests keep the very same view
object), so 256 rows cost only the few lines that moved since the last frame.
"""
from __future__ import annotations

from functools import partial

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from roseplay.tui.widgets.grammar_line import GRAMMAR_STYLE
from roseplay.tui.widgets.kv_host import hit_cell
from roseplay.tui.widgets.borders import WidthBorders, border_form
from roseplay.tui.widgets.stopped import CUT_OFF, CUT_STYLE, with_caption
from roseplay.tui.widgets.wait_reason import (seat_reasons, short_reason,  # noqa: F401
                                              waiting_reason)
from roseplay.tui.widgets.request_ids import ID_WIDTH, id_need, short_id
from roseplay.workload.own_prompts import OWN_PREFIX

ACTIVE = ("waiting", "compiling", "prefilling", "decoding", "preempted", "dedup")
STATE_STYLE = {"waiting": "#9aa0aa", "prefilling": "bold #f2c14e", "decoding": "bold #4cc97a",
               "preempted": "bold #ff6b6b", "dedup": "bold #c792ea", "compiling": GRAMMAR_STYLE, "finished": "#6f9fd8",
               "cancelled": "#777777", "error": "bold #ff5555"}
COLUMNS = (("id", ID_WIDTH, "<"), ("state", 10, "<"), ("pri", 3, ">"), ("progress", 0, "<"),
           ("prompt", 6, ">"), ("hit", 5, ">"), ("gen", 4, ">"), ("TTFT", 6, ">"),
           ("TPOT", 6, ">"))
PROGRESS_MIN, PROGRESS_MAX = 8, 40
ID_MAX = 16             # a wide list gives the id what progress cannot use (whole ids)
DROP_ORDER = ("prompt", "hit", "gen", "pri", "TPOT")   # what a narrow list gives up first
# under scheduling_policy=priority the pri column says why a row waits (guide 9 watches
# it): TPOT goes before it (80x24 hid pri)
PRIORITY_DROP_ORDER = ("prompt", "hit", "gen", "TPOT", "pri")
BAR_EMPTY = "#343a46"
_STYLES: dict[str, Style] = {}


def st(spec: str) -> Style:
    """Parsed rich styles, cached (rows are built from raw Segments: no markup parsing)."""
    style = _STYLES.get(spec)
    if style is None:
        style = _STYLES[spec] = Style.parse(spec) if spec else Style()
    return style


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    if ms >= 10000:
        return f"{seconds:.1f}s"
    return f"{ms:.0f}ms" if ms >= 100 else f"{ms:.1f}ms"


def bar(frac: float, width: int, color: str) -> list[Segment]:
    """A smooth progress bar of exactly `width` cells (eighth blocks)."""
    frac = min(1.0, max(0.0, frac))
    full, part = divmod(round(frac * width * 8), 8)
    segs = [Segment("█" * full, st(color))] if full else []
    if full < width:
        segs.append(Segment(" ▏▎▍▌▋▊▉"[part], st(f"{color} on {BAR_EMPTY}")))
        segs.append(Segment(" " * (width - full - 1), st(f"on {BAR_EMPTY}")))
    return segs


# by state: what the engine works on this step first (prefill chunks, decodes), then the
# queue, then the finished
STATE_ORDER = ("prefilling", "dedup", "decoding", "preempted", "waiting")
SORTS = {"arrival": None,
         "state": lambda r: STATE_ORDER.index(r.state) if r.state in STATE_ORDER else 9,
         "TTFT": lambda r: -(r.ttft or 0.0), "TPOT": lambda r: -(r.tpot or 0.0),
         "prompt": lambda r: -r.prompt_tokens, "hit": lambda r: -r.cached_tokens,
         "generated": lambda r: -r.output_tokens,
         "priority": lambda r: r.priority}        # lower first, as the priority policy serves
FILTERS = (None, "active", "waiting", "prefilling", "decoding", "preempted", "finished")


def arrange(requests, sort: str = "arrival", state: str | None = None) -> list:
    """Rows to show: filtered by state ("active" = any active one), then sorted."""
    if state == "active":
        requests = [r for r in requests if r.state in ACTIVE]
    elif state:
        requests = [r for r in requests if r.state == state]
    key = SORTS[sort]
    if key is None:      # active by arrival, then finished ones newest first
        return [r for r in requests if r.state in ACTIVE] + \
               [r for r in reversed(requests) if r.state not in ACTIVE]
    return sorted(requests, key=key)


def progress_cell(r, budget: int, width: int, reason: str = "queued for a slot",
                  cut: bool = False) -> list[Segment]:
    """What the request is doing, as a bar plus words, exactly `width` cells; `cut`: the
    engine stopped while it was in flight: how far it got, in the stop's colour."""
    if r.state == "prefilling":
        n = r.chunks_total(budget)
        # the longest words that leave the bar 3 cells: "chunk k/n" is never cut
        label = next((w for w in (f" chunk {r.chunks_done}/{n} {r.computed_tokens}/"
                                  f"{r.prefill_target}", f" chunk {r.chunks_done}/{n}",
                                  f" {r.chunks_done}/{n}") if len(w) + 3 <= width),
                     f"{r.chunks_done}/{n}")        # a bar of 1 cell: k/n is never cut
        frac, color = r.computed_tokens / max(1, r.prefill_target), "#f2c14e"
    elif r.state in ("decoding", "dedup"):
        # tokens/max, or in a narrow column the tokens alone (the bar shows the rest)
        label = next((w for w in (f" {r.output_tokens}/{r.max_tokens}", f" {r.output_tokens}")
                      if len(w) + 3 <= width), f" {r.output_tokens}")
        frac, color = r.output_tokens / max(1, r.max_tokens), "#4cc97a"
    elif cut:           # no bar: where it stood ("was waiting", "was preempted ×2")
        more = f" ×{r.preemptions}" if r.state == "preempted" else ""
        return [Segment(_fit(f"was {r.state}{more}", width, "<"), st(CUT_STYLE))]
    else:
        text, style = {
            "waiting": (reason, "dim"),
            "preempted": (f"preempted ×{r.preemptions}: {_comeback(r)}", "#ff6b6b"),
            "error": (f"error: {r.error or ''}", "#ff5555"),
        }.get(r.state, (r.finish_reason or r.state, "dim"))
        if r.state == "waiting" and len(text) > width:
            text = short_reason(text, width)
        elif r.state == "preempted" and len(text) > width:    # (the state column says it)
            text = next((w for w in (f"×{r.preemptions}: {_comeback(r)}", f"×{r.preemptions}")
                         if len(w) <= width), text)
        return [Segment(_fit(text, width, "<"), st(style))]
    bw = max(1 if len(label) + 3 > width else 3, width - len(label))
    color = CUT_STYLE if cut else color
    return bar(frac, bw, color) + [Segment(_fit(label, width - bw, "<"), st(color))]


def _comeback(r) -> str:
    """How a preempted request gets its KV back: reloaded from the host tier (swap) or
    computed again."""
    return "swapped" if r.swapped else "recompute"


def id_cell(r, width: int) -> list[Segment]:
    """The request's id; a constrained one (structured outputs) marked with a "{"."""
    style = st("bold" if r.request_id.startswith(OWN_PREFIX) else "")
    if getattr(r, "grammar", None) is None:
        return [Segment(short_id(r.request_id, width).ljust(width), style)]
    return [Segment("{", st(GRAMMAR_STYLE)),
            Segment(short_id(r.request_id, width - 1).ljust(width - 1), style)]


def _fit(text: str, width: int, align: str) -> str:
    if len(text) > width:
        return text[:max(0, width - 1)] + "…" if width else ""
    return text.rjust(width) if align == ">" else text.ljust(width)


class RequestList(WidthBorders, Widget, can_focus=True):
    """Active requests (arrival order), then finished ones (newest first).

    Only lines whose content changed are refreshed (`refresh(Region)`), so Textual
    re-renders a handful of lines per frame rather than the whole table.
    """

    DEFAULT_CSS = """
    RequestList { height: 1fr; min-height: 4; }
    """
    BINDINGS = [Binding("up,k", "move(-1)", "Select", show=False),
                Binding("down,j", "move(1)", "Select", show=False),
                Binding("pageup", "move(-10)", show=False),
                Binding("pagedown", "move(10)", show=False),
                Binding("home", "move(-100000)", show=False),
                Binding("escape", "unselect", "Follow", show=False)]

    class Selected(Message):
        def __init__(self, request_id: str | None):
            super().__init__()
            self.request_id = request_id

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rows: list = []
        self.budget = 1
        self.reason = ""
        self.reasons: dict[str, str] = {}   # queued rows the free seats leave behind
        self.stopped = False                 # the engine stopped: no row is in flight now
        self.sort, self.state_filter = "arrival", None
        self.selected: str | None = None     # chosen by the user (None: follow the first)
        self.pending: str | None = None      # select this one as soon as it shows up
        self._kept = None                    # the selected row's last view (show's `pin`)
        self.top = 0
        self.id_need = 0                     # cells the ids shown need (show's rows)
        self.priority = False                # scheduling_policy=priority (show's)
        self._shown: dict[int, tuple] = {}   # line y -> what it showed when last drawn

    # -- data --------------------------------------------------------------------------
    def show(self, requests, budget: int, reason: str = "", stopped: bool = False,
             pin: bool = True, reasons: dict[str, str] | None = None,
             priority: bool = False) -> None:
        """`reason`: why the waiting rows wait, `reasons` those that differ (wait_reason.py
        seat_reasons). `stopped`: the engine stopped for good: rows in flight then read
        cut off.
        `pin`: the selected request, once ended, keeps its row as last seen after the
        snapshot lets it go (an ended request stays in snapshots only while it is among
        the latest RECENT_FINISHED, engine/core/core.py: seconds under load); a replay,
        whose frames go back in time, passes False. `priority`: the queue orders by
        priority (the pri column stays longer)."""
        if priority != self.priority:
            self.priority = priority
            self._shown.clear()         # other columns: every line anew
            self.refresh()
        kept = self._kept
        if pin and kept is not None and kept.request_id == self.selected \
                and kept.state not in ACTIVE \
                and not any(r.request_id == kept.request_id for r in requests):
            requests = [*requests, kept]
        self.rows, self.budget = arrange(requests, self.sort, self.state_filter), budget
        # the id column's cells its ids need to read apart (a grammar's "{" takes one)
        self.id_need = max((id_need(r.request_id) + (getattr(r, "grammar", None) is not None)
                            for r in self.rows), default=0)
        self.reason, self.reasons, self.stopped = reason, reasons or {}, stopped
        if self.pending and any(r.request_id == self.pending for r in self.rows):
            self.selected, self.pending = self.pending, None
        if self.selected and not any(r.request_id == self.selected for r in self.rows):
            self.selected = None
        self._kept = self.current if self.selected else None
        self._scroll_to_cursor()
        self._refresh_changed()

    def _line_key(self, y: int) -> tuple:
        i = self.top + y - 1
        if y == 0 or i >= len(self.rows):
            return (y == 0, i < len(self.rows), self.size.width, self.id_need)
        r = self.rows[i]
        return (r, r is self.current, self.budget, self.size.width, self.id_need,
                self._reason(r) if r.state == "waiting" else "", self.stopped)

    def _reason(self, r) -> str:
        return self.reasons.get(r.request_id, self.reason)

    def _refresh_changed(self) -> None:
        dirty = []
        for y in range(self.size.height):
            key, old = self._line_key(y), self._shown.get(y)
            if old is None or len(old) != len(key) or old[1:] != key[1:] or not (
                    old[0] is key[0] or old[0] == key[0]):
                dirty.append(Region(0, y, self.size.width, 1))
        if len(dirty) > self.size.height // 2:
            self.refresh()
        elif dirty:
            self.refresh(*dirty)

    @property
    def current(self):
        """The highlighted request: the user's choice, else the first active row (below
        the finished ones a sort by TTFT puts first)."""
        if self.selected:
            return next((r for r in self.rows if r.request_id == self.selected), None)
        return next((r for r in self.rows if r.state in ACTIVE), None)

    def _cursor(self) -> int:
        cur = self.current
        return next((i for i, r in enumerate(self.rows) if r is cur), -1)

    # -- keys and mouse --------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        if not self.rows:
            return
        i = self._cursor()
        i = max(0, min(len(self.rows) - 1, (0 if i < 0 else i + delta)))
        self.select(self.rows[i].request_id)

    def action_unselect(self) -> None:
        self.select(None)

    def select(self, request_id: str | None) -> None:
        self.selected = request_id
        if request_id is None:      # follow again: bring the followed row into view (the
            self.top = max(0, self._cursor())   # list stayed where a typed prompt was)
        self._scroll_to_cursor()
        self._refresh_changed()
        self.post_message(self.Selected(request_id))

    def on_click(self, event) -> None:
        i = self.top + event.y - 1
        if event.y >= 1 and 0 <= i < len(self.rows):
            self.select(self.rows[i].request_id)

    def _scroll_by(self, delta: int) -> None:
        self.top = max(0, min(max(0, len(self.rows) - self._visible()), self.top + delta))
        self._refresh_changed()

    def on_mouse_scroll_down(self, event) -> None:
        self._scroll_by(3)

    def on_mouse_scroll_up(self, event) -> None:
        self._scroll_by(-3)

    def _visible(self) -> int:
        return max(1, self.size.height - 1)

    def _scroll_to_cursor(self) -> None:
        i, vis = self._cursor(), self._visible()
        if i >= 0 and self.selected:
            if i < self.top:
                self.top = i
            elif i >= self.top + vis:
                self.top = i - vis + 1
        self.top = max(0, min(self.top, max(0, len(self.rows) - vis)))

    # -- drawing -------------------------------------------------------------------------
    def columns(self) -> list[tuple]:
        """The columns that fit the width (DROP_ORDER goes first), progress at least 8."""
        cols = list(COLUMNS)
        for name in PRIORITY_DROP_ORDER if self.priority else DROP_ORDER:
            if sum(w for _, w, _ in cols) + len(cols) - 1 + PROGRESS_MIN <= self.size.width:
                break
            cols = [c for c in cols if c[0] != name]
        return cols

    def hidden_columns(self) -> list[str]:
        shown = {c[0] for c in self.columns()}
        return [name for name, _, _ in COLUMNS if name not in shown]

    def show_subtitle(self, stop: int | None = None) -> None:
        """The stop, sort, filter and the columns too narrow to show, under the list."""
        self.set_borders(partial(self._subtitle, stop))

    def _subtitle(self, stop: int | None, width: int) -> tuple[None, str]:
        """The longest form that fits whole: the hidden columns named, else counted."""
        parts = ([f"sorted by {self.sort}"] if self.sort != "arrival" else []) + (
            [f"only {self.state_filter}"] if self.state_filter else [])
        hidden = self.hidden_columns()
        tails = ([f"no room for {', '.join(hidden)}: z zooms",
                  f"{len(hidden)} columns hidden: z zooms", "z zooms"] if hidden else [])
        forms = [" · ".join(parts + [tail]) for tail in tails] or [" · ".join(parts)]
        return None, with_caption(stop, border_form(forms, width), width)

    def _widths(self, cols) -> list[int]:
        fixed = sum(w for _, w, _ in cols) + len(cols) - 1     # (a blank between two)
        room = self.size.width - fixed
        progress = max(PROGRESS_MIN, min(PROGRESS_MAX, room))
        # what progress cannot use, and what the ids need of what it can spare (80x24:
        # `w0kqf-10000` takes 9 cells of a 10-cell bar: `…kqf10000`, not `…-10000`)
        need = min(self.id_need, COLUMNS[0][1] + room - PROGRESS_MIN) - COLUMNS[0][1]
        more_id = max(0, min(ID_MAX - COLUMNS[0][1], max(room - progress, need)))
        progress = min(progress, room - more_id) if more_id else progress
        return [w + more_id if name == "id" else w or progress for name, w, _ in cols]

    def _strip(self, cells: dict, background: Style | None) -> Strip:
        cols = self.columns()
        segments: list[Segment] = []
        for (name, _, align), w in zip(cols, self._widths(cols)):
            if segments:        # the panel's padding is the first column's margin
                segments.append(Segment(" "))
            cell = cells[name]
            if callable(cell):
                segments.extend(cell(w))
            else:
                text, style = cell
                segments.append(Segment(_fit(text, w, align), st(style)))
        strip = Strip(segments).adjust_cell_length(self.size.width)
        return strip.apply_style(background) if background is not None else strip

    def _row(self, r, selected: bool) -> Strip:
        cut = self.stopped and r.state in ACTIVE     # in flight when the engine stopped
        state = (CUT_OFF, CUT_STYLE) if cut else (r.state, STATE_STYLE.get(r.state, ""))
        cells = {"id": lambda w: id_cell(r, w), "state": state,
                 # scheduling_policy=priority: lower first (the workload's documents: 1)
                 "pri": (str(r.priority), "#c792ea" if r.priority else "dim"),
                 "progress": lambda w: progress_cell(r, self.budget, w, self._reason(r), cut),
                 "prompt": (str(r.prompt_tokens), ""),
                 "hit": hit_cell(r),
                 "gen": (str(r.output_tokens), ""), "TTFT": (fmt_ms(r.ttft), ""),
                 "TPOT": (fmt_ms(r.tpot), "")}
        return self._strip(cells, st("on #3b3f5c") if selected else None)

    def render_line(self, y: int) -> Strip:
        self._shown[y] = self._line_key(y)
        if y == 0:
            return self._strip({name: (name, "bold underline #aab2c0") for name, _, _ in COLUMNS},
                               None)
        i = self.top + y - 1
        if i >= len(self.rows):
            if i == len(self.rows) == 0:
                empty = f" no {self.state_filter} request" if self.state_filter else \
                    " no requests yet"
                return Strip([Segment(empty, st("dim"))]).adjust_cell_length(self.size.width)
            return Strip.blank(self.size.width)
        r = self.rows[i]
        return self._row(r, r is self.current)

    def on_resize(self) -> None:
        self._shown.clear()
        self.refresh()

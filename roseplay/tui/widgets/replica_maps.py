"""Data parallelism in the KV panel: each replica's own pool as a small KV map (kv_map.py's
drawing, scaled down to fit: one cell stands for `k` blocks), its load under it
(replica_load.py), and the router's totals on the last line."""
from __future__ import annotations

import functools

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.color import Color
from textual.containers import Horizontal, Vertical
from textual.strip import Strip

from roseplay.tui.widgets.kv_map import KVMap
from roseplay.tui.widgets.replica_load import ReplicaFigures, imbalance
from roseplay.tui.widgets.stopped import BLANK, STOP_STYLE
from roseplay.tui.widgets.text_view import TextView

LOAD_ROWS = 4       # the figures under each map (a fifth: its host tier)
IN_USE, CACHED = 1, 2   # block states (EngineSnapshot.block_state: free, in use, cached)
DEAD = " dead"          # after a dead replica's head
STOPPED_DIM = 0.4       # how much of its colours a dead replica's map keeps (0: none)


def scale_blocks(state: np.ndarray, refcount: np.ndarray, selected: np.ndarray, k: int):
    """Pool arrays with one entry per `k` blocks: a cell takes the state most of its
    blocks have (in use, then cached, on a tie), the highest refcount among them, and is
    selected if one of its blocks is."""
    if k <= 1:
        return state, refcount, selected
    n = len(state)
    pad = -n % k
    st = np.concatenate([state, np.zeros(pad, state.dtype)]).reshape(-1, k)
    rc = np.concatenate([refcount, np.zeros(pad, refcount.dtype)]).reshape(-1, k)
    used, cached = (st == IN_USE).sum(1), (st == CACHED).sum(1)
    free = k - used - cached
    cell = np.where((used >= cached) & (used >= free) & (used > 0), IN_USE,
                    np.where((cached >= free) & (cached > 0), CACHED, 0)).astype(state.dtype)
    return cell, rc.max(1), np.unique(np.asarray(selected, np.int64) // k)


class MiniKVMap(KVMap):
    """A KVMap of a whole pool in its panel: `k` blocks a cell, the fewest that fit."""

    DEFAULT_CSS = "MiniKVMap { height: 1fr; min-height: 1; scrollbar-size-vertical: 1; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.k = 1
        self._given = None
        self.stopped = False        # a dead replica's: its last pool, dimmed

    def show_pool(self, state, refcount, selected, stopped: bool = False) -> None:
        self._given = (state, refcount, selected, stopped)
        self.k = self.blocks_per_cell(len(state))
        if stopped != self.stopped:       # every row redrawn, faded or not
            self.stopped = stopped
            self._strips.clear()
            self.refresh()
        super().show(*scale_blocks(state, refcount, selected, self.k))

    def _build(self, row: int) -> Strip:
        strip = super()._build(row)
        if not self.stopped:
            return strip
        bg = self.background_colors[1]
        return Strip([Segment(seg.text, dimmed(seg.style, bg)) for seg in strip],
                     strip.cell_length)

    def blocks_per_cell(self, n: int) -> int:
        """The fewest blocks a cell so that the densest drawing ("half": two cells a
        character) holds the pool without scrolling."""
        cells = 2 * max(1, self.size.width - 1) * max(1, self.size.height)
        return max(1, -(-n // cells))

    def on_resize(self) -> None:
        if self._given is not None and self.blocks_per_cell(len(self._given[0])) != self.k:
            self.show_pool(*self._given)        # a new scale: the shape changes, relayout
        else:
            self._relayout()


@functools.lru_cache(maxsize=1024)
def dimmed(style: Style | None, background: Color) -> Style | None:
    """`style` with its colours STOPPED_DIM of the way from the panel's background (the
    cell keeps its glyph and its state's hue, faded: a pool that no longer changes)."""
    if style is None:
        return None
    fade = lambda c: None if c is None or c.is_default else background.blend(   # noqa: E731
        Color.from_rich_color(c), STOPPED_DIM).rich_color
    return style + Style.from_color(fade(style.color), fade(style.bgcolor))


def load_text(f: ReplicaFigures, width: int, chosen: bool = False) -> Text:
    """The figures under replica `f.rank`'s map, in the longest forms that fit. A dead
    replica's head keeps " dead" whole (the words before it shrink), and its KV line
    says which step its map is as of (its last snapshot, as a stopped engine's panels)."""
    def pick(*forms: str, keep: str = "") -> str:
        return next((s for s in forms if len(s + keep) <= width), forms[-1])
    pct = "-" if f.hit_rate is None else f"{100 * f.hit_rate:.0f}%"
    ttft = "-" if f.ttft_p50 is None else f"{1000 * f.ttft_p50:.0f}ms"
    toks = BLANK if not f.alive else "-" if f.tok_s is None else f"{f.tok_s:.0f}"
    t = Text(no_wrap=True, overflow="ellipsis")
    dead = "" if f.alive else DEAD
    head = pick(f"replica {f.rank} · routed {f.routed}", f"r{f.rank} routed {f.routed}",
                f"r{f.rank} {f.routed}", keep=dead)
    t.append(head, "bold reverse #f2d34f" if chosen else "bold")
    t.append(dead, STOP_STYLE)
    # a dead replica's last snapshot is not its load now: it serves nothing
    w, r, score = (f.waiting, f.running, f.score) if f.alive else (BLANK,) * 3
    t.append("\n" + pick(f"waiting {w} · running {r} · 4w+r {score}",
                         f"wait {w} run {r} 4w+r {score}", f"w{w} r{r} 4w+r {score}",
                         f"w{w} r{r} ={score}"))
    kv = f"KV {f.used}/{f.total}"
    if f.alive:
        t.append("\n" + pick(f"{kv} blocks · hit {pct}", f"{kv} hit {pct}",
                             f"{f.used}/{f.total} {pct}"))
    else:
        t.append("\n" + pick(f"{kv} blocks · as of step {f.step}",
                             f"{kv} · as of step {f.step}", f"{kv} @{f.step}",
                             f"{f.used}/{f.total} @{f.step}"), "dim")
    t.append("\n" + pick(f"TTFT p50 {ttft} · {toks} tok/s", f"TTFT {ttft} {toks} tok/s",
                         f"{ttft} {toks}t/s"), "dim")
    if f.host:      # its host KV tier (the merged host map gives way to the maps)
        n, cached, swapped, out, back = f.host
        t.append("\n" + pick(f"host {n}: {cached} cached · {swapped} swapped · "
                             f"total →{out} ←{back}", f"host {cached}c {swapped}s →{out} ←{back}",
                             f"h {cached}c {swapped}s"))
    return t


def totals_text(policy: str, routed, width: int) -> Text:
    """The router's totals: requests per replica and the imbalance (most / mean)."""
    imb = imbalance(routed)
    shown = "-" if imb is None else f"{imb:.2f}"
    per = "/".join(map(str, routed))
    forms = (f"routing {policy} (u) · requests {per} · imbalance {shown} (most/mean)",
             f"{policy} (u) · requests {per} · imbalance {shown}",
             f"{policy} · {per} · imb {shown}", f"{per} imb {shown}")
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(next((s for s in forms if len(s) <= width), forms[-1]), "bold #5fb3f0")
    return t


class LoadView(TextView):
    DEFAULT_CSS = f"LoadView {{ height: {LOAD_ROWS}; text-wrap: nowrap; text-overflow: ellipsis; }}"


class ReplicaColumn(Vertical):
    DEFAULT_CSS = "ReplicaColumn { width: 1fr; height: 1fr; margin-right: 1; }"

    def __init__(self, rank: int, **kwargs):
        super().__init__(**kwargs)
        self.map, self.load = MiniKVMap(id=f"replica-map-{rank}"), LoadView(id=f"replica-load-{rank}")

    def compose(self):
        yield self.map
        yield self.load


class ReplicaMaps(Vertical):
    """N small maps side by side, each with its load; the router's totals under them."""

    DEFAULT_CSS = """
    ReplicaMaps { height: 1fr; display: none; }
    ReplicaMaps > Horizontal { height: 1fr; }
    ReplicaMaps > #replica-totals { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.columns: list[ReplicaColumn] = []
        self.row = Horizontal()
        self.totals = TextView(id="replica-totals")

    def compose(self):
        yield self.row
        yield self.totals

    def show(self, snaps, figures: list[ReplicaFigures], policy: str, selected_id: str | None,
             chosen: int | None) -> None:
        """`chosen`: the replica that serves the selected request (its blocks turn yellow
        on its map, its header is marked)."""
        if len(self.columns) != len(snaps):
            self.row.remove_children()
            self.columns = [ReplicaColumn(r) for r in range(len(snaps))]
            self.row.mount_all(self.columns)
        for col, snap, f in zip(self.columns, snaps, figures):
            req = snap.request(selected_id) if selected_id and f.rank == chosen else None
            blocks = np.asarray(req.blocks if req is not None else (), np.int64)
            col.map.show_pool(snap.block_state, snap.block_refcount, blocks, not f.alive)
            rows = LOAD_ROWS + bool(f.host)
            if col.load.styles.height is None or col.load.styles.height.value != rows:
                col.load.styles.height = rows
            col.load.show(load_text(f, max(8, col.size.width), f.rank == chosen))
        self.totals.show(totals_text(policy, [f.routed for f in figures],
                                     max(20, self.size.width)))

    def scale(self) -> int:
        """Blocks a cell (the most of any map: they share one width)."""
        return max((c.map.k for c in self.columns), default=1)

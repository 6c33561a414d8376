"""KV cache map: every KV block as a coloured cell, drawn with the Line API.

The densest layout that fits the panel is chosen: two columns per block with the
refcount digit, one column per block, or two blocks per character (upper half block
glyph, foreground = upper block, background = lower block). Each text row is one Strip
made of runs of equal style, cached until the snapshot or the selection changes, so
thousands of blocks cost a few hundred segments per refresh.
"""
from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

# cell categories
FREE, USED, CACHED, SHARED, SELECTED = 0, 1, 2, 3, 4
COLORS = {FREE: "#30343c", USED: "#2e9e5b", CACHED: "#2f6db5", SHARED: "#e08a1e",
          SELECTED: "#f2d34f"}
NAMES = {FREE: "free", USED: "used", SHARED: "shared", CACHED: "cached",
         SELECTED: "selected request"}
_BG = {k: Style(bgcolor=c, color="#111111" if k in (SHARED, SELECTED) else "#e8e8e8", bold=True)
       for k, c in COLORS.items()}
_BG[FREE] = Style(bgcolor=COLORS[FREE], color="#5a606c")
_FG = {k: Style(color=c) for k, c in COLORS.items()}
_FG[FREE] = Style(color="#3a3f4a")
_HALF = {(a, b): Style(color=COLORS[a], bgcolor=COLORS[b]) for a in COLORS for b in COLORS}
_BLANK = Style()


def categories(state: np.ndarray, refcount: np.ndarray, selected: np.ndarray | None) -> np.ndarray:
    """Per block: FREE / USED / CACHED / SHARED / SELECTED (int8)."""
    cat = state.astype(np.int8, copy=True)
    cat[(state == 1) & (refcount > 1)] = SHARED
    if selected is not None and len(selected):
        cat[selected] = SELECTED
    return cat


def _digit(rc: int, cat: int) -> str:
    if cat == FREE:
        return " "
    if rc > 9:
        return "+"
    return str(rc) if rc > 1 or cat == SELECTED else " "


class KVMap(ScrollView):
    """The block grid (Line API). Hover a cell to see its block in the legend below."""

    DEFAULT_CSS = """
    KVMap { height: 1fr; min-height: 3; scrollbar-size-vertical: 1; }
    """
    MODES = ("roomy", "digits", "solid", "half")
    CELL = {"roomy": 3, "digits": 2, "solid": 1, "half": 1}     # columns per block

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._cat = np.zeros(0, np.int8)
        self._rc = np.zeros(0, np.int32)
        self._strips: dict[int, Strip] = {}
        self.mode = "digits"
        self.cols = 1
        self.hover_block: int | None = None

    def show(self, state: np.ndarray, refcount: np.ndarray, selected: np.ndarray | None) -> None:
        """Take new block arrays; refresh only the text rows whose blocks changed."""
        cat = categories(state, refcount, selected)
        if cat.shape != self._cat.shape:
            self._cat, self._rc = cat, refcount
            self._relayout()
            return
        changed = np.flatnonzero((cat != self._cat) | (refcount != self._rc))
        self._cat, self._rc = cat, refcount
        if not len(changed):
            return
        rows = np.unique(changed // self.cols)
        if self.mode == "half":
            rows = np.unique(rows // 2)
        elif self.mode == "roomy":
            rows = rows * 2
        top = int(self.scroll_offset.y)
        for row in rows.tolist():
            self._strips.pop(row, None)
        visible = [r - top for r in rows.tolist() if top <= r < top + self.size.height]
        if len(visible) > self.size.height // 2:
            self.refresh()
        elif visible:
            self.refresh(*(Region(0, y, self.size.width, 1) for y in visible))

    def on_resize(self) -> None:
        self._relayout()

    def _relayout(self) -> None:
        region = self.scrollable_content_region
        n, width, height = len(self._cat), max(1, region.width - 1), max(1, region.height)
        for mode in self.MODES:
            cols, rows = self._geometry(mode, n, width)
            if rows <= height:
                break
        self.mode, self.cols = mode, cols
        self._strips.clear()
        self.virtual_size = Size(width, rows)
        self.refresh()

    @staticmethod
    def _geometry(mode: str, n: int, width: int) -> tuple[int, int]:
        cols = max(1, width // KVMap.CELL[mode])
        block_rows = -(-n // cols)
        if mode == "roomy":
            return cols, 2 * block_rows - 1
        return cols, (-(-block_rows // 2) if mode == "half" else block_rows)

    def render_line(self, y: int) -> Strip:
        row = y + int(self.scroll_offset.y)
        strip = self._strips.get(row)
        if strip is None:
            strip = self._strips[row] = self._build(row)
        return strip.crop(0, self.size.width)

    def _build(self, row: int) -> Strip:
        if self.mode == "half":
            return self._build_half(row)
        if self.mode == "roomy":
            if row % 2:
                return Strip([])
            row //= 2
        lo = row * self.cols
        cats, rcs = self._cat[lo:lo + self.cols], self._rc[lo:lo + self.cols]
        segments: list[Segment] = []
        for cat, rc in zip(cats.tolist(), rcs.tolist()):
            char = _digit(rc, cat)
            if self.mode == "roomy":
                segments += [Segment(" " + char, _BG[cat]), Segment(" ", _BLANK)]
            elif self.mode == "digits":     # a 7/8 block leaves a gap between rows
                cell = Segment(char, _BG[cat]) if char.strip() else Segment("▇", _FG[cat])
                segments += [cell, Segment(" ", _BLANK)]
            elif segments and segments[-1].style is _BG[cat]:
                segments[-1] = Segment(segments[-1].text + char, _BG[cat])
            else:
                segments.append(Segment(char, _BG[cat]))
        return Strip(segments)

    def _build_half(self, row: int) -> Strip:
        top_lo, bot_lo = 2 * row * self.cols, (2 * row + 1) * self.cols
        top = self._cat[top_lo:top_lo + self.cols].tolist()
        bottom = self._cat[bot_lo:bot_lo + self.cols].tolist()
        segments: list[Segment] = []
        run, style = 0, None
        for i, a in enumerate(top):
            b = bottom[i] if i < len(bottom) else None
            st = _HALF[(a, b)] if b is not None else Style(color=COLORS[a])
            if st is style or st == style:
                run += 1
                continue
            if style is not None:
                segments.append(Segment("▀" * run, style))
            run, style = 1, st
        if style is not None:
            segments.append(Segment("▀" * run, style))
        return Strip(segments)

    def block_at(self, x: int, y: int) -> int | None:
        row = y + int(self.scroll_offset.y)
        if self.mode == "roomy":
            if row % 2:
                return None
            row //= 2
        cell = self.CELL[self.mode]
        if cell > 1:
            col = x // cell if x % cell < cell - 1 else None
        else:
            col = x
        if col is None or col >= self.cols:
            return None
        if self.mode == "half":
            return None if row * 2 * self.cols >= len(self._cat) else self._half_index(row, col)
        i = row * self.cols + col
        return i if i < len(self._cat) else None

    def _half_index(self, row: int, col: int) -> int | None:
        i = 2 * row * self.cols + col       # the upper block of the cell
        return i if i < len(self._cat) else None

    def on_mouse_move(self, event) -> None:
        self.hover_block = self.block_at(event.x, event.y)

    def on_leave(self) -> None:
        self.hover_block = None


class KVLegend(Widget):
    """Colour legend, usage figures and the hovered block's details."""

    DEFAULT_CSS = "KVLegend { height: 3; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()

    def show(self, text: Text) -> None:
        if text != self._text:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text


def legend_text(snap, selected_id: str | None, mode: str, hover: str) -> Text:
    counts = {FREE: snap.num_free, USED: snap.num_used - snap.num_shared,
              SHARED: snap.num_shared, CACHED: snap.num_cached}
    t = Text(no_wrap=True, overflow="ellipsis")
    for cat in (FREE, USED, SHARED, CACHED):
        t.append("  ", Style(bgcolor=COLORS[cat]))
        t.append(f" {NAMES[cat]} ")
        t.append(f"{counts[cat]}  ", "bold")
    if selected_id:
        t.append("  ", Style(bgcolor=COLORS[SELECTED]))
        t.append(f" {selected_id}")
    c = snap.counters
    used_pct = 100.0 * snap.num_used / max(1, snap.num_blocks)
    peak = snap.extra.get("peak_used_blocks")
    t.append("\n")
    t.append(f"in use {snap.num_used}/{snap.num_blocks} ({used_pct:.0f}%)", "bold")
    if peak is not None:
        t.append(f" peak {peak}")
    t.append(f" · hit rate {100 * c.prefix_hit_rate:.0f}% · evicted {c.evictions}"
             f" · preempted {c.preemptions} · COW {c.cow_copies}")
    digits = "digit = refcount" if mode in ("roomy", "digits") else (
        "digits when ref>1" if mode == "solid" else "2 blocks per cell (top/bottom)")
    t.append(f"\n{hover or f'{snap.block_size} tokens per block · {digits} · hover a cell'}",
             "dim" if not hover else "")
    return t


def hover_text(snap, block: int | None) -> str:
    if block is None or block >= snap.num_blocks:
        return ""
    state = ("free", "in use", "cached (evictable)")[int(snap.block_state[block])]
    rc = int(snap.block_refcount[block])
    holders = [r.request_id for r in snap.requests if block in r.blocks and r.state not in
               ("finished", "cancelled", "error")]
    who = f" · held by {', '.join(holders[:6])}{' …' if len(holders) > 6 else ''}" if holders else ""
    return f"block {block}: {state} · refcount {rc}{who}"


class KVPanel(Vertical):
    """The KV cache map with its legend (border title shows the pool geometry)."""

    DEFAULT_CSS = "KVPanel { height: 1fr; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.map, self.legend = KVMap(id="kv-map"), KVLegend(id="kv-legend")

    def compose(self):
        yield self.map
        yield self.legend

    def show(self, snap, selected) -> None:
        kv = self.map
        blocks = np.asarray(selected.blocks if selected else (), dtype=np.int64)
        kv.show(snap.block_state, snap.block_refcount, blocks)
        title = f"KV cache · {snap.num_blocks} blocks × {snap.block_size} tokens"
        if self.border_title != title:
            self.border_title = title
        hover = hover_text(snap, kv.hover_block)
        self.legend.show(
            legend_text(snap, selected.request_id if selected else None, kv.mode, hover))

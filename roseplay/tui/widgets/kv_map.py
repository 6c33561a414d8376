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
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from roseplay.tui.widgets import theme

# cell categories: block states, then the selected request, then recent engine events
FREE, USED, CACHED, SHARED, SELECTED, COW, PREEMPTED, EVICTED, HIT, ROLLBACK = range(10)
THEME_KEY = {FREE: "free", USED: "used", CACHED: "cached", SHARED: "shared",
             SELECTED: "selected", COW: "cow", PREEMPTED: "preempt", EVICTED: "evict",
             HIT: "hit", ROLLBACK: "rollback"}
NAMES = {FREE: "free", USED: "used", SHARED: "shared", CACHED: "cached",
         SELECTED: "selected request", COW: "COW copy", PREEMPTED: "preempted",
         EVICTED: "evicted", HIT: "prefix hit", ROLLBACK: "rolled back"}
# flashes read without colour; R: a block a speculative verify rolled back (freed)
LETTER = {COW: "C", PREEMPTED: "P", EVICTED: "E", HIT: "H", ROLLBACK: "R"}
CACHED_GLYPH = "░"      # cached-but-free: a shade, never the solid cell of a block in use
_BLANK = Style()
_styles: dict = {}


def styles() -> dict:
    """Cell styles of the current theme: bg (filled cell), fg (glyph), half (two blocks)."""
    gen = theme.generation()
    if _styles.get("gen") != gen:
        colors = {k: theme.color(v) for k, v in THEME_KEY.items()}
        dark = (SHARED, SELECTED, COW, HIT, PREEMPTED, ROLLBACK)
        bg = {k: Style(bgcolor=c, color="#111111" if k in dark else "#e8e8e8", bold=True)
              for k, c in colors.items()}
        bg[FREE] = Style(bgcolor=colors[FREE], color="#5a606c")
        fg = {k: Style(color=c) for k, c in colors.items()}
        fg[FREE] = Style(color="#3a3f4a")
        fg[CACHED] = Style(color=colors[CACHED], bgcolor="#1c2230")
        half = {(a, b): Style(color=colors[a], bgcolor=colors[b]) for a in colors for b in colors}
        # a flash: the event's colour behind the cell, underlined; the digit stays
        flash = {k: Style(bgcolor=colors[k], color="#111111", bold=True, underline=True)
                 for k in LETTER}
        _styles.update(gen=gen, colors=colors, bg=bg, fg=fg, half=half, flash=flash)
    return _styles


def categories(state: np.ndarray, refcount: np.ndarray, selected: np.ndarray | None) -> np.ndarray:
    """Per block: FREE / USED / CACHED / SHARED / SELECTED (int8)."""
    cat = state.astype(np.int8, copy=True)
    cat[(state == 1) & (refcount > 1)] = SHARED
    if selected is not None and len(selected):
        cat[selected] = SELECTED
    return cat


def flashes(n: int, flash: dict[int, int] | None) -> np.ndarray:
    """Per block: the event category of a recent flash, or 0 (FREE: none)."""
    out = np.zeros(n, np.int8)
    for block, kind in (flash or {}).items():
        if 0 <= block < n:
            out[block] = kind
    return out


def _digit(rc: int, cat: int, fl: int = 0) -> str:
    """The refcount when it says something (> 1, or the selected request's blocks); else
    a flash's letter; a refcount digit is never replaced by a flash."""
    if cat == FREE and not fl:
        return " "
    if rc > 9:
        return "+"
    if rc > 1 or (cat == SELECTED and rc):
        return str(rc)
    return LETTER.get(fl, " ")


class KVMap(ScrollView):
    """The block grid (Line API). Hover a cell to see its block in the legend below."""

    DEFAULT_CSS = """
    KVMap { height: 1fr; min-height: 3; scrollbar-size-vertical: 1; }
    """
    MIN_ROWS = 3
    # roomiest first; "roomy" and "tall" leave a blank row between block rows (a tall
    # panel, 200x60, used to fall to "digits" and fill half its rows)
    MODES = ("roomy", "tall", "digits", "solid", "half")
    CELL = {"roomy": 3, "tall": 2, "digits": 2, "solid": 1, "half": 1}     # columns per block
    SPACED = ("roomy", "tall")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._cat = np.zeros(0, np.int8)
        self._fl = np.zeros(0, np.int8)         # flashes (event category per block, 0: none)
        self._rc = np.zeros(0, np.int32)
        self._strips: dict[int, Strip] = {}
        self.mode = "digits"
        self.cols = 1
        self.hover_block: int | None = None
        self._gen = theme.generation()

    def show(self, state: np.ndarray, refcount: np.ndarray, selected: np.ndarray | None,
             flash: dict[int, int] | None = None) -> None:
        """Take new block arrays; refresh only the text rows whose blocks changed."""
        cat, fl = categories(state, refcount, selected), flashes(len(state), flash)
        if cat.shape != self._cat.shape or self._gen != theme.generation():
            self._gen = theme.generation()
            self._cat, self._fl, self._rc = cat, fl, refcount
            self._relayout()
            return
        changed = np.flatnonzero((cat != self._cat) | (fl != self._fl) | (refcount != self._rc))
        self._cat, self._fl, self._rc = cat, fl, refcount
        if not len(changed):
            return
        rows = np.unique(changed // self.cols)
        if self.mode == "half":
            rows = np.unique(rows // 2)
        elif self.mode in self.SPACED:
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
        # the whole widget, not scrollable_content_region: that one still lacks the
        # scrollbar column of the previous (zoomed) layout, and no resize follows when the
        # scrollbar goes, so `z` then `Z` used to leave the map a mode too dense
        region = self.size
        n, width, height = len(self._cat), max(1, region.width - 1), max(1, region.height)
        self.mode, self.cols, rows = self.pick_mode(n, width, height)
        self._strips.clear()
        self.virtual_size = Size(width, rows)
        self.refresh()

    @classmethod
    def pick_mode(cls, n: int, width: int, height: int) -> tuple[str, int, int]:
        """(mode, blocks per row, text rows): the roomiest mode whose rows fit."""
        for mode in cls.MODES:
            cols, rows = cls._geometry(mode, n, width)
            if rows <= height:
                break
        return mode, cols, rows

    @staticmethod
    def _geometry(mode: str, n: int, width: int) -> tuple[int, int]:
        cols = max(1, width // KVMap.CELL[mode])
        block_rows = -(-n // cols)
        if mode in KVMap.SPACED:
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
        if self.mode in self.SPACED:
            if row % 2:
                return Strip([])
            row //= 2
        lo = row * self.cols
        sl = slice(lo, lo + self.cols)
        segments: list[Segment] = []
        for cat, fl, rc in zip(self._cat[sl].tolist(), self._fl[sl].tolist(),
                               self._rc[sl].tolist()):
            char, style = _cell(cat, fl, rc, self.mode)
            if self.mode == "roomy":
                segments += [Segment(" " + char, style), Segment(" ", _BLANK)]
            elif self.mode in ("digits", "tall"):
                segments += [Segment(char, style), Segment(" ", _BLANK)]
            elif segments and segments[-1].style is style:
                segments[-1] = Segment(segments[-1].text + char, style)
            else:
                segments.append(Segment(char, style))
        return Strip(segments)

    def _build_half(self, row: int) -> Strip:
        top_lo, bot_lo = 2 * row * self.cols, (2 * row + 1) * self.cols
        shown = np.where(self._fl > 0, self._fl, self._cat)     # no room for a mark: colour
        top = shown[top_lo:top_lo + self.cols].tolist()
        bottom = shown[bot_lo:bot_lo + self.cols].tolist()
        segments: list[Segment] = []
        run, style = 0, None
        sty = styles()
        for i, a in enumerate(top):
            b = bottom[i] if i < len(bottom) else None
            st = sty["half"][(a, b)] if b is not None else sty["fg"][a]
            if st is style or st == style:
                run += 1
                continue
            if style is not None:
                segments.append(Segment("▀" * run, style))
            run, style = 1, st
        if style is not None:
            segments.append(Segment("▀" * run, style))
        return Strip(segments)

    def shown_blocks(self) -> tuple[int, int]:
        """(first, last + 1) of the blocks the visible rows draw (a map taller than its
        panel scrolls)."""
        n, top, height = len(self._cat), int(self.scroll_offset.y), max(1, self.size.height)
        per_row = {"half": 2 * self.cols}.get(self.mode, self.cols)
        if self.mode in self.SPACED:
            top, height = (top + 1) // 2, (height + 1) // 2
        return min(n, top * per_row), min(n, (top + height) * per_row)

    def cell_text(self, block: int) -> str:
        """What the cell of `block` reads (its glyph), for tests and the hover line."""
        return _cell(int(self._cat[block]), int(self._fl[block]), int(self._rc[block]),
                     self.mode)[0]

    def block_at(self, x: int, y: int) -> int | None:
        row = y + int(self.scroll_offset.y)
        if self.mode in self.SPACED:
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


def _cell(cat: int, fl: int, rc: int, mode: str) -> tuple[str, Style]:
    """(glyph, style) of one block: a flash keeps the digit and marks the cell with the
    event's colour, underlined; cached blocks are a shade, blocks in use a solid cell."""
    sty = styles()
    char = _digit(rc, cat, fl)
    if fl:
        return char, sty["flash"][fl]
    if cat == CACHED:
        return CACHED_GLYPH, sty["fg"][CACHED]
    if mode in ("digits", "tall") and not char.strip():   # 7/8 of a cell: rows stay apart
        return "▇", sty["fg"][cat]
    return char, sty["bg"][cat]

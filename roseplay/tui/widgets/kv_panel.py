"""The KV cache panel: the block map (kv_map.py) with its legend underneath: counts per
colour, pool usage and peak, the last-10-s and total counters, and the hovered block;
with a host tier, its own small map below (kv_host.py)."""
from __future__ import annotations

from functools import partial

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.containers import Vertical

from roseplay.tui.widgets.kv_host import HostTierView, percent, short_count as _k
from roseplay.tui.widgets.borders import WidthBorders, border_form
from roseplay.tui.widgets.stopped import BLANK, with_caption
from roseplay.tui.widgets.replica_maps import ReplicaMaps
from roseplay.tui.widgets.reshow import ReshownOnResize
from roseplay.tui.widgets.kv_map import (CACHED, CACHED_GLYPH, FREE, NAMES, SELECTED, SHARED, USED,
                                         KVMap, styles)
from roseplay.tui.widgets.text_view import TextView


class KVLegend(ReshownOnResize, TextView):
    """Colour legend, usage, last-10-s and total counters, and the hovered block. Its
    words take the form its width has (legend_text), so a new width writes them again:
    the width a panel had when it was last drawn (at start, before Textual sized it)
    would otherwise stay on screen until the next snapshot."""

    DEFAULT_CSS = "KVLegend { height: 4; text-wrap: nowrap; text-overflow: ellipsis; }"
    ROWS = 4

    def show_legend(self, snap, selected_id: str | None, mode: str, hover: str, window,
                    stopped: bool) -> None:
        self.redraw_on_resize(partial(self.show_legend, snap, selected_id, mode, hover,
                                      window, stopped))
        self.show(legend_text(snap, selected_id, mode, hover, window, self.size.width,
                              stopped))


def legend_text(snap, selected_id: str | None, mode: str, hover: str, window,
                width: int = 80, stopped: bool = False) -> Text:
    """Four lines: colours with counts; usage (or the hovered block); last 10 s; totals.
    The words shrink with the width (60+, 44+, narrower: initials) so nothing is cut.
    `stopped`: the engine stopped for good: nothing happens now, so a blank in place of
    the last 10 s (the totals stand)."""
    tier = 2 if width >= 60 else 1 if width >= 44 else 0
    counts = {FREE: snap.num_free, USED: snap.num_used - snap.num_shared,
              SHARED: snap.num_shared, CACHED: snap.num_cached}
    t = Text(no_wrap=True, overflow="ellipsis")
    bg = styles()["bg"]
    for cat in (FREE, USED, SHARED, CACHED):
        if tier == 0:       # the initial on its colour: f(ree) u(sed) s(hared) c(ached)
            t.append(NAMES[cat][0], bg[cat])
            t.append(f" {counts[cat]}  ", "bold")
        else:       # tier 1 (a 120-column screen): no padding, so the four fit in 44
            swatch = "  " if tier == 2 else " "
            t.append(*((CACHED_GLYPH * len(swatch), styles()["fg"][CACHED]) if cat == CACHED
                       else (swatch, Style(bgcolor=styles()["colors"][cat]))))
            t.append(f" {NAMES[cat]} " if tier == 2 else f"{NAMES[cat]} ")
            t.append(f"{counts[cat]} " + "  " * (tier == 2), "bold")
    if selected_id and t.cell_len + 2 + len(selected_id) <= width:   # whole, or not at all
        t.append(" ", Style(bgcolor=styles()["colors"][SELECTED]))
        t.append(f" {selected_id}")
    t.append("\n")
    if hover:
        t.append(hover)
    else:
        used = f"in use {snap.num_used}/{snap.num_blocks}"
        pct = f" ({100.0 * snap.num_used / max(1, snap.num_blocks):.0f}%)"
        rest = f" peak {window.peak_used(snap)}"
        words = f" · {_cell_words(mode)}"       # what fits, never a cut word
        if len(used + pct + rest + words) > width:
            words = ""
            if len(used + pct + rest) > width:
                pct = ""
        t.append(used + pct, "bold")
        t.append(rest + words, "dim")
    # the window's real span: it starts again at a knob change (counters.py)
    seconds = f"{min(window.window, max(window.span(), 0.0)):.0f}"
    since = "since reset" if window.base is not None else "total"
    pad = (4, 6, 12)[tier]      # large counts: the next shorter form, never a cut one
    recent_label = f"last {seconds} s"
    if tier == 1:
        since, recent_label = ("reset" if window.base is not None else "total",
                               f"{seconds} s")
    elif tier == 0:
        since, recent_label = ("rst" if window.base is not None else "all", f"{seconds}s")
    off = not snap.knobs.enable_prefix_caching      # no lookups: the rate would be stale
    lines = []
    for label, recent in ((recent_label, True), (since, False)):
        if recent and stopped:
            lines.append((label, None))
            continue
        get = window.recent if recent else window.total
        hit, ev, pre, cow = ("off" if off and recent else percent(window.hit_rate(recent)),
                             get("evictions"), get("preemptions"), get("cow_copies"))
        if recent:      # routine once the pool is full: a rate, not a flash or event each
            ev = f"{ev / max(window.span(), 1.0):.0f}/s"
        lines.append((label, (f"hit {hit:>4}  evicted {ev:<4} preempted {pre:<3} COW {cow}",
                              f"hit {hit} · evicted {ev} · preempted {pre} · COW {cow}",
                              f"hit {hit} ev {ev} pre {pre} C {cow}",
                              f"hit {hit} ev {_k(ev)} pre {_k(pre)} C {_k(cow)}",
                              f"hit {hit} ev{_k(ev)} pre{_k(pre)} C{_k(cow)}",
                              f"hit {hit} ev{_k(ev)} p{_k(pre)} C{_k(cow)}",
                              f"{hit} ev{_k(ev)} p{_k(pre)} C{_k(cow)}")[2 - tier:]))
    # one wording for both lines, the longest that fits both (120x40 read "ev 203/s" above
    # "evicted 5911"); a line that fits none takes its shortest
    shown = [forms for _, forms in lines if forms is not None]
    pick = next((i for i in range(len(shown[0])) if all(pad + len(f[i]) <= width
                                                          for f in shown)), -1)
    for label, forms in lines:
        if forms is None:
            t.append(f"\n{'now':<{pad}}", "dim")
            t.append(f"{BLANK} the engine stopped", "dim")
            continue
        t.append(f"\n{label:<{pad}}", "dim")
        t.append(forms[pick])
    return t


def _cell_words(mode: str) -> str:
    """Every digit shown is the block's refcount (shown above 1, and on each block of the
    selected request: ? help says so)."""
    return "2 blocks per cell" if mode == "half" else "digit = refcount"


def hover_text(snap, block: int | None) -> str:
    if block is None or block >= snap.num_blocks:
        return ""
    state = ("free", "in use", "cached (evictable)")[int(snap.block_state[block])]
    rc = int(snap.block_refcount[block])
    holders = [r.request_id for r in snap.requests if block in r.blocks and r.state not in
               ("finished", "cancelled", "error")]
    who = f" · held by {', '.join(holders[:6])}{' …' if len(holders) > 6 else ''}" if holders else ""
    return f"block {block}: {state} · refcount {rc}{who}"


_MODEL_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def pool_title(snap, width: int, merged: int = 0) -> str:
    """The pool's geometry, in the longest form that fits; an fp8 pool adds its bytes a
    block beside the model dtype's: the same memory holds 2x (bfloat16) or 4x (float32)
    the blocks. `merged`: the pools of that many data-parallel replicas shown as one (a
    recording keeps the front's merged snapshot, not each replica's)."""
    n, bs = snap.num_blocks, snap.block_size
    forms = [f"KV cache · {n} blocks × {bs} tokens", f"KV · {n} × {bs} tok"]
    if merged:
        forms = [f"KV cache · {merged} replicas merged · {n} blocks × {bs} tokens",
                 f"KV · {merged} replicas merged · {n} × {bs} tok",
                 f"KV · {merged} merged · {n} × {bs} tok", f"KV · {merged} merged · {n} × {bs}"]
    if snap.kv_cache_dtype != "auto" and snap.kv_bytes_per_rank:
        kib = snap.kv_bytes_per_rank / max(1, n) / 1024
        model = f"{snap.dtype} {_MODEL_BYTES.get(snap.dtype, 1) * kib:g}"
        forms = [forms[0] + f" · fp8 {kib:g} KiB a block ({model})",
                 forms[1] + f" · fp8 {kib:g} KiB/block ({model})",
                 forms[1] + " · fp8"]
    return border_form(forms, width)


def pool_borders(kv, snap, stopped_at: int | None, merged: int, width: int) -> tuple[str, str]:
    """The KV panel's title and subtitle at `width`: the pool's geometry, and which
    blocks the map shows when it cannot show every one (the stop, when stopped)."""
    first, end = kv.shown_blocks()      # say so when the map does not show every block
    subtitle = ""
    if end - first < snap.num_blocks:
        forms = (f"blocks {first}-{end - 1} of {snap.num_blocks}: scroll, z",
                 f"{first}-{end - 1} of {snap.num_blocks}: scroll, z")
        subtitle = border_form(forms, width)
    # a map cut by the panel keeps saying so: the legend's `now` row says the stop
    return pool_title(snap, width, merged), with_caption(stopped_at, subtitle, width,
                                                        keep_words=True)


class KVPanel(WidthBorders, Vertical):
    """The KV cache map with its legend (border title shows the pool geometry)."""

    DEFAULT_CSS = "KVPanel { height: 1fr; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.map, self.legend = KVMap(id="kv-map"), KVLegend(id="kv-legend")
        self.host = HostTierView()
        self.replica_maps = ReplicaMaps()      # data parallelism: a small map a replica

    def compose(self):
        yield self.map
        yield self.legend
        yield self.host
        yield self.replica_maps

    def show(self, snap, selected, window, flash: dict[int, int] | None = None,
             stopped_at: int | None = None, merged: int = 0) -> None:
        """`stopped_at`: the step the engine stopped after (None while it serves): the
        map and counts are as of then, and the caption says so. `merged`: the replicas
        whose pools the snapshot holds as one (a data-parallel recording), or 0."""
        kv = self.map
        blocks = np.asarray(selected.blocks if selected else (), dtype=np.int64)
        kv.show(snap.block_state, snap.block_refcount, blocks, flash)
        self.set_borders(partial(pool_borders, kv, snap, stopped_at, merged))
        self.host.show(snap, self.size.height - KVLegend.ROWS - KVMap.MIN_ROWS, window)
        least = KVMap.MIN_ROWS - (1 if self.host.display and not self.host.map.display else 0)
        if kv.styles.min_height is None or kv.styles.min_height.value != least:
            kv.styles.min_height = least      # (the host line's row, on a small panel)
        hover = hover_text(snap, kv.hover_block)
        self.legend.show_legend(snap, selected.request_id if selected else None, kv.mode,
                                hover, window, stopped_at is not None)

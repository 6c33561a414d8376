"""The host KV tier under the KV cache map (docs/KV_TIERS.md "Host tier"): a second,
smaller map of the host pool's blocks (cached: a full block the device evicted, kept
under its prefix key; used: a swapped-out request's block, with its refcount) and one
line of what the last step copied each way. Hidden when the engine has no host tier
(kv_offloading_size 0), so the screen is the same as without it. Also the request
list's hit cell, which marks hits that came from the host tier."""
from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical

from roseplay.tui.widgets import theme
from roseplay.tui.widgets.kv_map import KVMap
from roseplay.tui.widgets.text_view import TextView

MAP_ROWS = 3


def hit_cell(r) -> tuple[str, str]:
    """A request list's hit cell: its prefix-hit tokens, `h` after them (and the cached
    blocks' colour) when some came back from the host tier: `48h`."""
    if not r.cached_tokens:
        return "-", "#e08a1e"
    if r.host_cached_tokens:
        return f"{r.cached_tokens}h", theme.color("cached")
    return str(r.cached_tokens), "#e08a1e"


def host_line(snap, width: int = 80) -> Text:
    """`host tier 512 blocks: 300 cached, 12 swapped · last step → 4 ← 2 blocks (1.2 MB)`,
    shorter forms where the panel is narrow."""
    state = snap.host_block_state
    cached, used = int((state == 2).sum()), int((state == 1).sum())
    step = snap.last_step
    out, back = (step.blocks_to_host, step.blocks_from_host) if step else (0, 0)
    mb = ((step.bytes_to_host + step.bytes_from_host) / 1e6) if step else 0.0
    forms = (f"host tier {len(state)} blocks: {cached} cached, {used} swapped · "
             f"last step → {out} ← {back} blocks ({mb:.1f} MB)",
             f"host {len(state)}: {cached} cached, {used} swapped · → {out} ← {back}",
             f"host {cached}c {used}s → {out} ← {back}")
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(next((f for f in forms if len(f) <= width), forms[-1]), "bold")
    return t


class _Line(TextView):
    DEFAULT_CSS = "_Line { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }"


class HostTierView(Vertical):
    DEFAULT_CSS = f"""
    HostTierView {{ height: {MAP_ROWS + 1}; display: none; }}
    HostTierView KVMap {{ height: {MAP_ROWS}; min-height: 1; }}
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.line, self.map = _Line(), KVMap(id="kv-host-map")

    def compose(self):
        yield self.line
        yield self.map

    def show(self, snap, spare: int = MAP_ROWS + 1) -> None:
        """`spare`: the panel's rows left after the legend and the device map's least:
        too few for the host map, the line alone takes one (the map's least then
        gives it up; at 80x24 the whole view fell below the panel, unseen)."""
        on = snap.host_num_blocks > 0
        if self.display != on:
            self.display = on
        if on:
            rows = MAP_ROWS + 1 if spare >= MAP_ROWS + 1 else 1
            if self.styles.height is None or self.styles.height.value != rows:
                self.styles.height = rows
                self.map.display = rows > 1
            self.line.show(host_line(snap, self.size.width or 80))
            self.map.show(snap.host_block_state, snap.host_block_refcount, None)

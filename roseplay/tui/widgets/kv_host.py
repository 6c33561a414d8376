"""The host KV tier under the KV cache map (docs/KV_TIERS.md "Host tier"): a second,
smaller map of the host pool's blocks (cached: a full block the device evicted, kept
under its prefix key; used: a swapped-out request's block, with its refcount) and one
line of its totals: blocks copied each way, swap preemptions, prefix hits by tier.
Hidden when the engine has no host tier (kv_offloading_size 0), so the screen is the
same as without it. Also the request
list's hit cell, which marks hits that came from the host tier."""
from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical

from engine.metrics import prefix_hit_rate
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


def host_line(snap, width: int = 80, window=None) -> Text:
    """`host tier 512 blocks: 300 cached, 12 swapped · total →host 900 ←host 40 · swap out
    3 in 2 · hit device 61% host 9%`: the pool now, then the KV legend's totals (since the
    engine started, or the reset: `window`) of the copies each way, the swap preemptions
    and the prefix hits by tier (prompt tokens served from each / prompt tokens looked up:
    the legend's `hit` is their sum). Shorter forms where the panel is narrow. The last
    step's copies are the step panel's (`→host 4  ←host 2`)."""
    state = snap.host_block_state
    cached, used = int((state == 2).sum()), int((state == 1).sum())
    get = window.total if window is not None and window.now is not None else (
        lambda name: getattr(snap.counters, name))
    out, back = get("kv_offload_blocks"), get("kv_reload_blocks")
    s_out, s_in, s_re = get("swap_outs"), get("swap_ins"), get("swap_fallbacks")
    queried, hits = get("prefix_queried_tokens"), get("prefix_hit_tokens")
    from_host = get("host_prefix_hit_tokens")
    dev, host = (prefix_hit_rate(hits - from_host, queried), prefix_hit_rate(from_host, queried))
    dev, host = percent(dev), percent(host)
    since = "since reset" if window is not None and window.base is not None else "total"
    recompute = f" recompute {s_re}" if s_re else ""
    n = len(state)
    forms = (f"host tier {n} blocks: {cached} cached, {used} swapped · {since} →host {out} "
             f"←host {back} · swap out {s_out} in {s_in}{recompute} · "
             f"hit device {dev} host {host}",
             f"host {n}: {cached} cached, {used} swapped · →{out} ←{back} · "
             f"swap {s_out}/{s_in} · hit device {dev} host {host}",      # (200x60)
             f"host {n}: {cached} cached, {used} swapped · →{out} ←{back} · "
             f"swap {s_out}/{s_in} · hit host {host}",
             f"host {n}: {cached}c {used}s · →{out} ←{back} · swap {s_out}/{s_in}"
             f" · hit {host}",
             f"host {cached}c {used}s →{out} ←{back} hit {host}",
             f"host {cached}c {used}s →{short_count(out)} ←{short_count(back)} hit {host}",
             f"host {cached}c {used}s hit {host}")      # (80x24: the copies go whole)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(next((f for f in forms if len(f) <= width), forms[-1]), "bold")
    return t


def short_count(n) -> str:
    """A count in at most 4 characters (12345 -> 12k); a rate ("40/s") as it is."""
    if not isinstance(n, int) or n < 1000:
        return str(n)
    return f"{n / 1000:.1f}k" if n < 10_000 else f"{n // 1000}k" if n < 1_000_000 else \
        f"{n // 1_000_000}M"


def percent(rate: float | None) -> str:
    """A rate as `61%`, `-` without one (nothing looked up)."""
    return "-" if rate is None else f"{100 * rate:.0f}%"


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

    def show(self, snap, spare: int = MAP_ROWS + 1, window=None) -> None:
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
            self.line.show(host_line(snap, self.size.width or 80, window))
            self.map.show(snap.host_block_state, snap.host_block_refcount, None)

"""Every key of the app, defined once: the bindings, the footer, the help screen and the
command palette are all built from KEYS.

A key's `mode` says where it means something: "both", "live" (a running engine) or
"replay". Keys of the other mode are hidden from the footer, the help and the palette.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

from engine.config import MAX_SPECULATIVE_TOKENS


@dataclass(frozen=True)
class Key:
    keys: str            # Textual key names, comma separated
    action: str
    label: str           # short, for the footer
    help: str            # one line, for the help screen and the palette
    display: str         # how the key is written for people
    mode: str = "both"
    footer: bool = False
    knob: str = ""       # the live knob it changes (the knobs panel shows the key)
    # opens a text field: bound with priority, so the App runs it as the key arrives and
    # what is typed right after reaches the field (Textual routes each key to the widget
    # focused when it arrives: a binding run from that widget's queue moves the focus
    # only after the next keys went to the old widget, as the app's own keys)
    takes_text: bool = False


KEYS = (
    # one key, two bindings: the footer, the palette and a press take the one that applies
    # (RoseplayApp.check_action), so a paused app reads "space Resume"
    Key("space", "pause", "Pause", "pause the engine (a replay: its timeline)", "space",
        footer=True),
    Key("space", "resume", "Resume", "resume the engine (a replay: play on from this frame)",
        "space", footer=True),
    Key("n", "step", "Step", "one engine step, then stay paused (replay: next frame)", "n",
        footer=True),
    Key("b", "step_back", "Back", "previous frame", "b", "replay"),
    Key("left", "seek(-5)", "-5 s", "seek back 5 s", "←", "replay", footer=True),
    Key("right", "seek(5)", "+5 s", "seek forward 5 s", "→", "replay", footer=True),
    Key("g", "seek_to(0)", "Start", "go to the start", "g", "replay"),
    Key("G", "seek_to(-1)", "End", "go to the end", "G", "replay"),
    Key("v", "speed(1)", "Faster", "replay faster (×2, up to ×16)", "v", "replay"),
    Key("V", "speed(-1)", "Slower", "replay slower (÷2, down to ×0.25)", "V", "replay"),
    Key("c", "toggle_cache", "Cache", "prefix cache on / off (enable_prefix_caching)", "c",
        "live", knob="enable_prefix_caching"),
    Key("plus,equals_sign", "budget(1)", "Budget×2",
        "token budget ×2 (max_num_batched_tokens, up to the KV pool's tokens)", "+", "live",
        knob="max_num_batched_tokens"),
    Key("minus,underscore", "budget(-1)", "Budget÷2", "token budget ÷2 (down to 1)", "-",
        "live", knob="max_num_batched_tokens"),
    Key("right_square_bracket", "seqs(1)", "Seqs+", "max_num_seqs up (by 8; doubles below 8)",
        "]", "live", knob="max_num_seqs"),
    Key("left_square_bracket", "seqs(-1)", "Seqs-", "max_num_seqs down", "[", "live",
        knob="max_num_seqs"),
    Key("d", "spec_tokens(1)", "Spec+", "speculative decoding: one more draft token per "
        f"step (num_speculative_tokens, 0 = off, up to {MAX_SPECULATIVE_TOKENS})", "d", "live",
        knob="num_speculative_tokens"),
    Key("D", "spec_tokens(-1)", "Spec-", "one draft token fewer (0 turns speculation off)",
        "D", "live", knob="num_speculative_tokens"),
    Key("m", "cycle_knob('scheduling_mode', 1)", "Mode",
        "step composition: budget → prefill-first → mixed-chunk (scheduling_mode)", "m", "live",
        knob="scheduling_mode"),
    Key("M", "cycle_knob('scheduling_mode', -1)", "Mode back", "previous scheduling_mode",
        "M", "live", knob="scheduling_mode"),
    Key("p", "cycle_knob('scheduling_policy', 1)", "Queue",
        "queue order: fcfs → priority → lpm (scheduling_policy)", "p", "live",
        knob="scheduling_policy"),
    Key("P", "cycle_knob('scheduling_policy', -1)", "Queue back", "previous scheduling_policy",
        "P", "live", knob="scheduling_policy"),
    Key("e", "cycle_knob('eviction_policy', 1)", "Evict",
        "prefix-cache eviction: lru ↔ lfu (eviction_policy)", "e", "live",
        knob="eviction_policy"),
    Key("h", "cycle_knob('preemption_mode', 1)", "Preempt",
        "preemption: recompute ↔ swap to the host tier (preemption_mode; swap needs "
        "--kv-offloading-size)", "h", "live", knob="preemption_mode"),
    Key("u", "routing(1)", "Route", "data-parallel routing policy: round_robin → least_load "
        "→ consistent_hash → cache_first → cache_aware (roseplay --data-parallel-size 2 or "
        "more)", "u",
        "live"),
    Key("U", "routing(-1)", "Route back", "previous routing policy", "U", "live"),
    Key("s", "scenario(1)", "Scenario", "next scenario", "s", "live"),
    Key("S", "scenario(-1)", "Scenario back", "previous scenario", "S", "live"),
    Key("greater_than_sign,full_stop", "concurrency(1)", "Conc+",
        "more requests in flight (concurrency)", ">", "live"),
    Key("less_than_sign,comma", "concurrency(-1)", "Conc-", "fewer requests in flight", "<",
        "live"),
    Key("r", "rate(1)", "Rate", "next request rate (∞, 1, 2, 5 … 50 req/s)", "r", "live"),
    Key("R", "rate(-1)", "Rate back", "previous request rate", "R", "live"),
    Key("x", "clear_cache", "Clear", "clear the prefix cache (cached blocks become free)", "x",
        "live"),
    Key("i,slash", "prompt", "Prompt", "type a prompt (Enter sends it, Esc closes)", "i",
        "live", footer=True, takes_text=True),
    Key("o", "sort(1)", "Sort", "sort the requests: arrival, state, TTFT, TPOT, prompt, hit, "
        "generated, priority", "o"),
    Key("O", "sort(-1)", "Sort back", "previous sort order", "O"),
    Key("f", "filter(1)", "Filter", "show only requests in one state (all, active, waiting …)",
        "f"),
    Key("F", "filter(-1)", "Filter back", "previous state filter", "F"),
    Key("w", "scrub", "Tokens", "walk the selected finished request token by token: each "
        "token's distribution (model vs after penalties and bias) and its speculative "
        "origin (drafted, accepted)", "w"),
    Key("z", "zoom(1)", "Zoom", "zoom the next panel to the whole screen", "z", footer=True),
    Key("Z", "zoom(0)", "All", "back to all panels", "Z"),
    Key("l", "edit_slos", "SLOs", "goodput SLOs: type ttft:MS tpot:MS e2el:MS; the timing "
        "panel shows the share of finished requests meeting all of them", "l",
        takes_text=True),
    Key("0", "reset_stats", "Reset", "reset stats: totals, the 10 s window and the plots", "0"),
    Key("t", "theme", "Theme", "colour-blind-safe colours on / off", "t"),
    Key("question_mark,f1", "help", "Help", "this help", "?", footer=True),
    Key("q", "quit", "Quit", "quit (stops the workload, joins the engine, exit code 0); "
        "ctrl+c too", "q",
        footer=True),
)
LIST_KEYS = (("↑ ↓  k j", "select a request (its blocks turn yellow on the map)"),
             ("PgUp PgDn", "move the selection by 10"),
             ("Esc", "follow the first active request again (or close the prompt / help)"),
             ("ctrl+p", "command palette: every action, and type a knob value "
                        "(e.g. `max_num_seqs 32`, `budget 1024`, `rate 5`)"))


def bindings() -> list[Binding]:
    """One Binding per key: `display` writes a Key's first key only, and a second key is
    written as Textual writes it (where a focused field takes `?` as text, the footer
    shows the f1 that still opens the help, not a `?` that types)."""
    # ctrl+c quits too, from any widget (Textual's default only toasts "press ctrl+q")
    return [Binding(key, k.action, k.label, show=k.footer,
                    key_display=k.display if i == 0 else None, tooltip=k.help,
                    priority=k.takes_text)
            for k in KEYS for i, key in enumerate(k.keys.split(","))] + [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]


TEXT_ACTIONS = frozenset(k.action for k in KEYS if k.takes_text)


def for_mode(kind: str) -> list[Key]:
    return [k for k in KEYS if k.mode in ("both", kind)]


def knob_key(name: str) -> str | None:
    """How the key(s) of a live knob are written (the knobs panel and the help show it):
    one key that toggles or cycles forward ("c", "m"), or down/up ("-/+", "D/d")."""
    keys = [k for k in KEYS if k.knob == name]
    if any("cycle_knob" in k.action for k in keys):
        keys = [k for k in keys if k.action.endswith(", 1)")]
    down = [k.display for k in keys if k.action.endswith("(-1)")]
    up = [k.display for k in keys if not k.action.endswith("(-1)")]
    return "/".join(down + up) or None


def key_of(name: str) -> Key | None:
    """The Key a Textual key name ("c", "left") is one of the keys of."""
    return next((k for k in KEYS if name in k.keys.split(",")), None)


def other_mode_note(name: str, kind: str) -> str | None:
    """What the message line says for a key of the other mode (its binding is off, so
    it does nothing): where it works; None for a key of this mode or none of ours."""
    k = key_of(name)
    if k is None or k.mode in ("both", kind):
        return None
    if k.mode == "live":
        return (f"{k.display} acts on a live engine only ({k.help}); a replay plays the "
                "knobs and the workload as recorded")
    return f"{k.display} acts in a replay only ({k.help}; roseplay --replay FILE)"


def action_mode(action: str) -> str:
    return next((k.mode for k in KEYS if k.action.split("(")[0] == action), "both")

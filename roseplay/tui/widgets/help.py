"""The help screen: every panel in plain words, the keys, the knobs and the scenarios.

Keys come from roseplay/tui/keys.py (only those of the current mode: live or replay), knob
texts from engine/config.py and scenario texts from roseplay/workload/scenarios.py, so nothing
here can drift from what the app does. The text scrolls from the keyboard at once
(↑/↓, j/k, PgUp/PgDn, Home/End): the scroll area has the focus.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.widgets import Static

from roseplay.tui.guides.catalog import GUIDES, ROUTING_GUIDES, describe, split_knobs
from roseplay.tui.keys import LIST_KEYS, for_mode, knob_key
from roseplay.workload.scenarios import SCENARIOS
from roseplay.tui.widgets.knobs import live_fields
from roseplay.tui.widgets.timing import UPDATE_EVERY

PANELS = """\
# roseplay: what you are looking at

{source} The panels redraw from the engine's latest *snapshot*, up to {hz} times a
second (the Timing figures {timing_hz} times, so they can be read; paused, on each step
and key).
Panels that do not fit the terminal are listed in the line above the footer:
`z` zooms one panel to the whole screen.

## KV cache
The GPU/CPU memory for attention keys and values is cut into fixed-size **blocks**
(a block holds the KV of `block_size` tokens). Each cell is one block:
**grey** free, **green** in use by one request, **orange** shared by several requests
(the digit is the *refcount*: how many requests point at it), **blue shade ░**
cached: free, no request uses it, but its contents are kept in the prefix cache and
reused if a new prompt starts with the same tokens (or evicted when memory runs out).
**Yellow** cells belong to the selected request. Hover a cell for its details.
When the engine does something to blocks, they flash for a moment: the event's colour
behind the cell, underlined, with its letter where no refcount digit is shown (a digit
is never hidden): **C** copy-on-write (a shared, partly filled block copied before a
request writes into it), **P** preempted (freed: the request goes back to the queue and
recomputes), **H** prefix hit (cached blocks a new prompt starts with), **R** rolled
back (a block speculative decoding's rejected drafts had filled, freed by the verify). Evictions (a
cached block reused for new tokens) are routine once the pool is full: they do not
flash; the legend and the event log give their rate per second. A digit is always the
block's refcount: shown when it is above 1, and on every block of the selected request.
Under the map: the prefix hit rate (`off` while the cache is off), evictions,
preemptions and COW copies over the **last 10 s** (fewer seconds just after a knob
change: the window starts again there) and in total (`0` and every guide reset the
totals). A narrow legend abbreviates: **f** free, **u** used, **s** shared, **c**
cached; **ev** evicted, **pre** or **p** preempted, **C** COW copies; `10s` the last 10 s, `all`
the total, `rst` since the reset. A map taller than its panel scrolls; its bottom line
then says which blocks show (`blocks 0-173 of 512: scroll, z`).
With a **host tier** (`--kv-offloading-size`) a smaller map of host memory follows:
**░** cached blocks the device evicted (copied there, kept under their prefix), solid the
blocks of a request preempted by **swap** (`h`). Its line gives the pool and, since the
start or `0`, the blocks copied to the host (`→`: offloads and swap-outs) and back (`←`:
reloads and swap-ins), the swaps, and the prefix hit rate **by tier**: prompt tokens
found in device blocks and in host blocks, of those looked up (together the legend's
`hit`). A request's hit cell reads `48h` when some of its hit came from the host.

## Replicas and routing (`roseplay --data-parallel-size N`)
With N engine replicas the KV panel shows each replica's own pool as a small map (one
cell stands for the blocks the border's `1 cell = k blocks` says: the state most of them
have, their highest refcount), and under each: its requests routed, **waiting**,
**running** and vLLM's load score **4w+r** (4 x waiting + running), KV blocks in use of
its pool, its prefix hit rate, TTFT p50 and output tok/s over the last 10 s (with a
host tier, its host pool and the blocks copied each way since the start). *This step* is
one replica's step: it names the replica (`r1 step 902`). The last
line: the routing policy, requests per replica and the **imbalance** (most / mean: 1.00
is even). The **Routing** panel is the selected request's routing card: the replica it
went to and the router's own reason, then per replica what the router weighed at that
moment: the prompt's blocks that replica held (`cached`, cache_aware and cache_first),
its waiting, running and active KV blocks, and its cost under the policy (`4w+r` for
least_load and cache_first, `w x uncached + active` for cache_aware; round_robin and
consistent_hash weigh none). cache_first (SGLang's rule) follows the cache while the
loads are within 8 of each other; cache_aware (Dynamo's cost) trades them on every
request.
`u` / `U` cycle the policy live; guides `a` and `b` show what it changes.

## Requests
One row per request: *waiting* (the row says why: `max_num_seqs` full, the token
budget used up, or too few free KV blocks for its next chunk), *prefilling* its prompt (the bar and "chunk
k/n": a long prompt is computed over several steps when the token budget is smaller
than the prompt: chunked prefill), *decoding* one token per step, *preempted*,
*dedup* (an identical prompt admitted in the same step rides on its twin's prefill),
*finished*. `pri` = the request's priority (lower first under scheduling_policy
priority: the workload's chat turns 0, its documents 1); `hit` = prompt tokens served
from the prefix cache; TTFT = time to first token, TPOT = time per output token. `o`
sorts, `f` filters by state.

## Events
The engine's recent events, newest first: COW copies, preemptions, evictions, prefix
hits, dedup joins, finished prefill chunks, with the request and the blocks involved.

## This step
One engine step runs ONE forward pass over a mixed batch: first one token for each
decoding request, then prefill chunks, until the **token budget** is used. The bar
shows decode (green) and prefill (yellow) tokens against the budget, which chunks ran,
and what the block manager did. With speculation on (`d`), `spec` says how many draft
tokens this step verified and how many the target accepted. Steps are counted from 1,
as in the top line.

## Steps
The last steps side by side, one column each (newest right): decode tokens (green,
bottom) and prefill tokens (yellow, top). Under them, over those steps: how many mixed
the two, ran prefill only or decode only (what `m` changes), the token budget and how
much of it the steps used (`+`/`-`), and the prefill chunks per prompt. With
speculation on, the drafts proposed and accepted in those steps, and **by pos**: of the
verifies with a draft at position j, the share that accepted it (and every draft
before it; vLLM's per-position acceptance). It falls with j: a longer k pays less and
less.

## Selected request: TTFT split, and `w`
Where a request's TTFT went: **queue** (arrival to its first scheduling), the earlier
prefill **chunks**, and the **last chunk's step** (its logits give the first token). The
Timing panel's `└` line gives each part's share over the last 10 s: on the default
workload most of TTFT is queueing. `w` walks a finished request token by token: the
distribution each token was sampled from (the model's beside it for a typed prompt) or,
under speculative decoding, whether it was an accepted draft, the bonus or a correction.

## Timing
p50/p95/p99 over the last 10 seconds (or since `0` or a knob change: the header says
how many seconds): TTFT of the requests whose **first token** came in that window,
TPOT of the requests that **finished** in it, ITL of every gap between two tokens in
it; output tokens per second; and curves over time (one point per 0.5 s). The TTFT
curve is the p50 of the 16 latest requests to get a first token, the same population
as the table's (a short window of it), so the two agree within a few seconds; TPOT's
curve is the p50 of the 16 latest to finish. The scale ignores rare outliers (a ▲ marks
a bar above it). A `▲label` on the time axis and a marked column show where a knob
changed (a replay draws the recorded changes). Time the engine spends paused is not
latency: the engine's serving clock stops while paused. With speculation, a line under
the ITL plot says why it is bursty: a verify emits several tokens at once, so part of
the gaps are 0 ms.

## Top line and message line
The top line: serving or paused, the step, finished requests, errors and requests the
engine refused (a pool too small for the scenario), the **decode path** that runs
(`C layer (cpu_native)`: the C kernels, on a CPU with AVX2 or AVX-512; `torch_sdpa (no C
layer)`: PyTorch's attention, the fallback without them; `triton` on a GPU), then
the model and device. The line above the footer gives the app's messages (what a knob
just turned does, warnings), what a small terminal hid, or the zoom. Once the engine
stopped (a red ■ STOPPED and why), the panels show its last snapshot, captioned `as of
step N · engine stopped`: requests in flight read `cut off` with how far they got, and
nothing reads as now (`— tok/s`, the plots end at `stop`).

## Guides and their scorecard
A guide (a digit on this screen) switches the engine to its setup, resets the stats,
and shows its **scorecard** in the Knobs panel: whether its window is clean yet (the
setup applied, the old requests gone, 20 warm-up steps), then each number the claim
names, what it expects, what the window measured and ✓ / ✗ (the same check as the
tests: roseplay/tui/guides/check.py). A comparison needs the other setup measured: its
partner guide's result this session, or the one key the card names (e.g. `P` back to
fcfs for guide 9), which the card then measures. Any other knob key ends the guide.
"""


def keys_markdown(kind: str) -> str:
    rows = ["| key | what it does |", "|---|---|"]
    rows += [f"| `{k.display}` | {k.help} |" for k in for_mode(kind)]
    rows += [f"| `{keys}` | {text} |" for keys, text in LIST_KEYS]
    title = "replay" if kind == "replay" else "live engine"
    return f"## Keys ({title})\n" + "\n".join(rows) + "\n"


def knobs_markdown() -> str:
    """Every live knob of engine/config.py: its help, its choices, and its `explain`
    paragraph when it has one (policy knobs do)."""
    lines = ["## Knobs (from engine/config.py)"]
    for f in live_fields():
        key = knob_key(f.name)
        choices = f.metadata.get("choices")
        lines.append(f"* {f'`{key}` ' if key else ''}**{f.name}**"
                     f"{' (' + ' / '.join(map(str, choices)) + ')' if choices else ''}: "
                     f"{f.metadata['help']}")
        if f.metadata.get("explain"):
            lines.append(f"\n  {f.metadata['explain']}\n")
    lines.append("\n## Scenarios (s / S cycle)")
    for s in SCENARIOS.values():
        lines.append(f"* **{s.name}** ({s.title}): {s.description}")
    return "\n".join(lines) + "\n"


def guides_text(kind: str) -> Text:
    """The tuning guides' claims, each with the digit that shows it live (Rich text, not
    Markdown: a long Markdown document mounts slowly and delays the first key)."""
    how = ("Press a guide's key (a digit, d, or a / b on roseplay --data-parallel-size 2) "
           "to switch the engine to that setup "
           "(scenario, knobs, workload); the help closes, the stats reset, and the Knobs "
           "panel becomes the guide's scorecard: when its window is clean, then each "
           "number the claim names, expected against measured."
           if kind == "live" else "On a live engine a digit (or d) switches it to that "
           "setup.")
    t = Text()
    t.append("Knob guidance (vLLM and SGLang tuning guides; routing: llm-d, Dynamo)\n",
             "bold #f2d34f")
    t.append(how + "\n\n", "italic")
    for g in GUIDES + ROUTING_GUIDES:
        _, skipped = split_knobs(g)
        t.append(f" {g.key} ", "bold reverse #5fb3f0")
        t.append(f" {g.claim} ", "bold")
        t.append(f"({g.source})", "dim")
        if skipped:
            t.append(f" (needs the {', '.join(skipped)} knob)", "italic #ff9f43")
        t.append(f"\n    setup: {describe(g)} · watch: {g.watch}\n", "dim")
    return t


class MarkdownText(Static):
    """Markdown drawn by Rich in one widget, its text kept as `source`: Textual's Markdown
    widget mounts a widget per block, and this help's ~600 took ~1.5 CPU-s to open."""

    def __init__(self, source: str, **kwargs):
        super().__init__(RichMarkdown(source), **kwargs)
        self.source = source


CLOSE_HINT = "↑↓ PgUp PgDn scroll · a guide's key runs it · esc closes"
REPLAY_CLOSE_HINT = "↑↓ PgUp PgDn scroll · esc closes"


class HelpScreen(ModalScreen):
    """A scrollable explanation; esc / q / ? close it, a digit picks a guide's setup
    (the app's `pick_guide`)."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close"),
                Binding("j", "scroll(1)", show=False), Binding("k", "scroll(-1)", show=False),
                *(Binding(g.key, f"pick('{g.key}')", show=False)
                  for g in GUIDES + ROUTING_GUIDES)]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help-guides, HelpScreen #help-intro, HelpScreen #help-body {
        padding: 0 2 1 2;
    }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 110; height: 90%;
        border: round $accent; background: $surface; padding: 0 2;
    }
    """

    def __init__(self, kind: str = "live", refresh_hz: float = 12, **kwargs):
        super().__init__(**kwargs)
        self._kind = kind
        self._hz = refresh_hz

    def compose(self) -> ComposeResult:
        source = ("A recording of an engine session plays back (no model is loaded)."
                  if self._kind == "replay" else
                  "A real inference engine runs in its own process (two in a compare view), "
                  "steered over ZMQ; a workload driver keeps sending it prompts.")
        with VerticalScroll(id="help-scroll"):
            intro, panels = PANELS.format(source=source, hz=f"{self._hz:g}",
                                          timing_hz=f"{1 / UPDATE_EVERY:g}").split(
                "## KV cache", 1)
            yield Static(RichMarkdown(intro), id="help-intro")
            yield Static(guides_text(self._kind), id="help-guides")
            yield MarkdownText("## KV cache" + panels + keys_markdown(self._kind)
                               + knobs_markdown() + "\n*esc, q or ? closes this screen.*",
                               id="help-body")

    def on_mount(self) -> None:
        scroll = self.query_one(VerticalScroll)
        scroll.focus()
        # how to move and leave, in view from the first page (it was said at the end only)
        scroll.border_subtitle = CLOSE_HINT if self._kind == "live" else REPLAY_CLOSE_HINT

    def action_pick(self, key: str) -> None:
        """A digit: close, then switch the engine to that guide's setup (live only)."""
        app = self.app
        self.dismiss()
        if self._kind == "live":
            app.pick_guide(key)

    def action_scroll(self, lines: int) -> None:
        self.query_one(VerticalScroll).scroll_relative(y=lines, animate=False)

"""The help screen: every panel in plain words, the keys, the knobs and the scenarios.

Keys come from the app's bindings, knob texts from engine/config.py and scenario texts
from roseplay/scenarios.py, so nothing here can drift from what the app does.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from roseplay.scenarios import SCENARIOS
from roseplay.widgets.knobs import KNOB_KEYS, live_fields

PANELS = """\
# roseplay: what you are looking at

A real inference engine runs in this process. A workload driver keeps sending it
prompts; every panel redraws {hz} times a second from the engine's latest *snapshot*.

## KV cache
The GPU/CPU memory for attention keys and values is cut into fixed-size **blocks**
(a block holds the KV of `block_size` tokens). Each cell is one block:
**grey** free, **green** in use by one request, **orange** shared by several requests
(the digit is the *refcount*: how many requests point at it), **blue** cached: no
request uses it, but its contents are kept in the prefix cache and reused if a new
prompt starts with the same tokens (or evicted, oldest first, when memory runs out).
**Yellow** cells belong to the selected request. Hover a cell for its details.
*Evictions* drop cached blocks; *preemptions* push a running request back to the
queue (its blocks freed) when no block is left; it recomputes later.

## Requests
One row per request: *waiting* for a slot, *prefilling* its prompt (the bar and
"chunk k/n": a long prompt is computed over several steps when the token budget is
smaller than the prompt: chunked prefill), *decoding* one token per step, *preempted*,
*dedup* (an identical prompt admitted in the same step rides on its twin's prefill),
*finished*. `hit` = prompt tokens served from the prefix cache; TTFT = time to first
token, TPOT = time per output token. Select with ↑/↓ (or a click) to see its text.

## This step
One engine step runs ONE forward pass over a mixed batch: first one token for each
decoding request, then prefill chunks, until the **token budget** is used. The bar
shows decode (green) and prefill (yellow) tokens against the budget, which chunks ran,
and what the block manager did: prefix-hit blocks, copy-on-write copies (a shared,
partly filled block is copied before a request writes into it), evictions,
preemptions.

## Timing
p50/p95/p99 of TTFT, TPOT and ITL (every gap between two tokens of a request) over
the last 10 seconds, output tokens per second, and their curves over time: change a
knob and watch the curves move. A small budget protects decode (TPOT/ITL) at the cost
of TTFT; the prefix cache cuts TTFT when prompts share a prefix.
"""


def keys_markdown(bindings) -> str:
    rows = ["| key | what it does |", "|---|---|"]
    seen = set()
    for b in bindings:
        if not isinstance(b, Binding) or b.action in seen or not b.description:
            continue
        seen.add(b.action)
        rows.append(f"| `{b.key_display or b.key}` | {b.description} |")
    return "## Keys\n" + "\n".join(rows) + "\n"


def knobs_markdown() -> str:
    lines = ["## Knobs (from engine/config.py)"]
    for f in live_fields():
        lines.append(f"* `{KNOB_KEYS.get(f.name, '')}` **{f.name}**: {f.metadata['help']}")
    lines.append("\n## Scenarios (s cycles)")
    for s in SCENARIOS.values():
        lines.append(f"* **{s.name}** ({s.title}): {s.description}")
    return "\n".join(lines) + "\n"


class HelpScreen(ModalScreen):
    """A scrollable explanation; any of esc / q / ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 110; height: 90%;
        border: round $accent; background: $surface; padding: 0 2;
    }
    """

    def __init__(self, bindings, refresh_hz: float = 12, **kwargs):
        super().__init__(**kwargs)
        self._app_bindings = bindings
        self._hz = refresh_hz

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(PANELS.format(hz=f"{self._hz:g}") + keys_markdown(self._app_bindings)
                           + knobs_markdown()
                           + "\n*esc, q or ? closes this screen.*")

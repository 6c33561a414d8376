"""Token scrub: a finished request's output walked token by token (key `w`).

For each token: its text, when it was emitted and the gap to the one before it, where it
came from under speculative decoding (a draft the target accepted, the target's bonus
token after a fully accepted draft, its correction in place of a rejected one, or a
plain decode), and, when the request asked for logprobs, the distribution it was
sampled from (the model's own beside it with raw_logprobs: what penalties and bias
moved). The data is the engine's TokenTrace (engine/outputs.py): only requests that
asked for logprobs or were verified with drafts have one (a request with logprobs is
never speculated: docs/SPECULATIVE.md), and the engine keeps the latest few (a typed
prompt's own comes back in its final output: roseplay/workload/own_prompts.py); the app
keeps what it saw in a TraceStore: the latest KEEP traces, and the latest KEEP_OWN of
the prompts typed here.
"""
from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.outputs import TOKEN_BONUS, TOKEN_CORRECTION, TOKEN_DRAFT, TOKEN_PLAIN
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.requests import fmt_ms
from roseplay.tui.widgets.token_choice import choice_text
from roseplay.workload.own_prompts import OWN_PREFIX

ORIGIN_STYLE = {TOKEN_DRAFT: "decode", TOKEN_BONUS: "tput", TOKEN_CORRECTION: "shared"}


class TraceStore:
    """The token traces the app has seen in snapshots, bounded: the latest KEEP, and
    the latest KEEP_OWN typed prompts besides (so the others' churn never evicts them).
    In a replay, a frame older than the last one (a seek back) starts it again from that
    frame's traces: a request that ends later has no trace yet at that time."""

    KEEP, KEEP_OWN = 32, 16

    def __init__(self):
        self._own: OrderedDict = OrderedDict()
        self._others: OrderedDict = OrderedDict()
        self._last: tuple = ()
        self._time = float("-inf")

    def feed(self, snap, replay: bool = False) -> None:
        traces = snap.traces
        if replay and snap.time < self._time:
            self._own.clear()
            self._others.clear()
            self._last = ()
        self._time = snap.time
        if traces is self._last:
            return
        self._last = traces
        for t in traces:
            own = t.request_id.startswith(OWN_PREFIX)
            store, keep = (self._own, self.KEEP_OWN) if own else (self._others, self.KEEP)
            if t.request_id not in store:
                store[t.request_id] = t
                while len(store) > keep:
                    store.popitem(last=False)

    def get(self, request_id: str | None):
        return self._own.get(request_id) or self._others.get(request_id)

    def ids(self) -> list[str]:
        """Every trace held, oldest first (typed prompts and the others by arrival)."""
        return list(self._own) + list(self._others)

    def __len__(self) -> int:
        return len(self._own) + len(self._others)


def piece(token_id: int, tokenizer) -> str:
    """A token's text in the ribbon (#id without a tokenizer; newlines visible)."""
    if tokenizer is None:
        return f"#{token_id} "
    return tokenizer.decode([int(token_id)]).replace("\n", "⏎") or "∅"


def ribbon(trace, cursor: int, tokenizer, room: int) -> Text:
    """The tokens around the cursor, each styled by origin, the cursor reversed."""
    ids, (codes, _) = trace.ids(), trace.origins()
    pieces = [piece(t, tokenizer) for t in ids]
    lo = hi = cursor
    used = len(pieces[cursor])
    while used < room and (lo > 0 or hi < len(pieces) - 1):
        if lo > 0 and (cursor - lo <= hi - cursor or hi == len(pieces) - 1):
            lo -= 1
            used += len(pieces[lo])
        else:
            hi += 1
            used += len(pieces[hi])
    t = Text(overflow="fold")
    t.append("…" if lo > 0 else "", "dim")
    for i in range(lo, hi + 1):
        key = ORIGIN_STYLE.get(int(codes[i]))
        style = theme.color(key) if key else ""
        t.append(pieces[i], f"bold reverse {style}".strip() if i == cursor else style)
    t.append("…" if hi < len(pieces) - 1 else "", "dim")
    return t


ORIGIN_GLYPH = {TOKEN_PLAIN: "·", TOKEN_DRAFT: "d", TOKEN_BONUS: "b", TOKEN_CORRECTION: "c"}
_EIGHTHS = " ▁▂▃▄▅▆▇█"
LABEL = 8


def overview(trace, cursor: int, width: int, mode: str = "") -> Text:
    """Every token as a column (the cursor's reversed), wrapped: its speculative origin
    (· plain, d accepted draft, b bonus, c correction), the gap before it (0 ms: emitted
    with the token before it), and with logprobs (a *_logprobs mode) the sampled
    token's probability."""
    codes, _ = trace.origins()
    times = trace.token_times()
    gaps = [0.0] + [float(b - a) for a, b in zip(times, times[1:])]
    top = max(gaps) or 1.0
    rows = [("origin", lambda i: (ORIGIN_GLYPH[int(codes[i])],
                                  theme.color(ORIGIN_STYLE.get(int(codes[i]), "free")))),
            ("gap", lambda i: (_EIGHTHS[min(8, round(8 * gaps[i] / top))] if i else " ",
                               theme.color("tput")))]
    if trace.top and mode.endswith("logprobs"):
        probs = trace.sampled_probs()
        rows.append(("p", lambda i: (_EIGHTHS[max(1, min(8, round(8 * probs[i])))],
                                     theme.color("decode"))))
    span = max(8, width - LABEL)
    t = Text(no_wrap=True)
    for lo in range(0, len(trace), span):
        for name, cell in rows:
            t.append(f"{name:<{LABEL}}", "dim")
            for i in range(lo, min(len(trace), lo + span)):
                char, color = cell(i)
                t.append(char, f"reverse bold {color}" if i == cursor else color)
            t.append("\n")
    return t


def verify_group(codes, drafts, i: int) -> tuple[int, int]:
    """[start, end) of the tokens one verify emitted together, token i among them."""
    lo = i
    while lo > 0 and codes[lo - 1] == TOKEN_DRAFT and drafts[lo - 1] == drafts[i]:
        lo -= 1
    hi = i + 1
    if codes[i] == TOKEN_DRAFT:
        while hi < len(codes) and codes[hi] == TOKEN_DRAFT and drafts[hi] == drafts[i]:
            hi += 1
        if hi < len(codes) and codes[hi] in (TOKEN_BONUS, TOKEN_CORRECTION):
            hi += 1
    return lo, hi


def origin_words(trace, i: int) -> Text:
    """Where token i came from under speculative decoding, in words."""
    codes, drafts = trace.origins()
    code, d = int(codes[i]), int(drafts[i])
    t = Text()
    if not d:
        return t.append("plain: the target sampled it in a step with no drafts for it", "dim")
    lo, hi = verify_group(codes, drafts, i)
    accepted = sum(1 for j in range(lo, hi) if codes[j] == TOKEN_DRAFT)
    words = {TOKEN_DRAFT: f"draft {i - lo + 1} of {d}, accepted by the target",
             TOKEN_BONUS: f"bonus: the target's token after all {d} drafts were accepted",
             TOKEN_CORRECTION: f"correction: the target's token in place of rejected draft "
                               f"{accepted + 1} of {d}"}[code]
    t.append(words, f"bold {theme.color(ORIGIN_STYLE[code])}")
    t.append(f" · its verify: {d} drafted → {accepted} accepted, tokens {lo + 1}-{hi} "
             "emitted at once", "dim")
    return t


def token_text(trace, i: int, tokenizer, mode: str, rows: int) -> Text:
    """Everything about token i: text, time, origin, distribution."""
    ids, times = trace.ids(), trace.token_times()
    t = Text()
    t.append(f"token {i + 1} of {len(trace)}", "bold")
    text = f"{piece(ids[i], tokenizer)!r} " if tokenizer is not None else ""
    t.append(f"  {text}#{int(ids[i])}  ")
    if i:
        gap = times[i] - times[i - 1]
        t.append(f"gap {fmt_ms(gap)} after token {i}" + (" (same step)" if gap == 0 else ""))
    else:
        t.append("the first token", "dim")
    t.append("\n")
    t.append_text(origin_words(trace, i))
    t.append("\n")
    lp = trace.logprobs_at(i)
    if lp is None:
        why = ("it asked for no logprobs" if not trace.top else
               "not kept for this token")
        t.append(f"no distribution: {why} (a request that asks for logprobs is never "
                 "speculated; type a prompt with i, it asks for the top 5)", "dim")
        return t
    view = SimpleNamespace(logprobs=lp, spec_draft_tokens=0, spec_accepted_tokens=0)
    return t.append_text(choice_text(view, tokenizer, mode or "processed_logprobs",
                                     max(2, rows)))


class TokenScrubScreen(ModalScreen):
    """One traced request, token by token: ←/→ move, ↑/↓ another traced request."""

    BINDINGS = [Binding("escape,w,q", "dismiss", "Close"),
                Binding("left,h", "move(-1)", "Token −1"),
                Binding("right,l", "move(1)", "Token +1"),
                Binding("pageup", "move(-10)", "−10", show=False),
                Binding("pagedown", "move(10)", "+10", show=False),
                Binding("home", "move(-1000000)", "First", show=False),
                Binding("end", "move(1000000)", "Last", show=False),
                Binding("up,k", "other(-1)", "Request −1"),
                Binding("down,j", "other(1)", "Request +1")]
    DEFAULT_CSS = """
    TokenScrubScreen { align: center middle; }
    TokenScrubScreen > Static {
        width: 96%; height: 94%; border: round $accent; background: $surface;
        padding: 0 1;
    }
    """

    def __init__(self, store: TraceStore, request_id: str, tokenizer=None, mode: str = "",
                 **kwargs):
        super().__init__(**kwargs)
        self.store, self.request_id = store, request_id
        self.tokenizer, self.mode = tokenizer, mode
        self.cursor = 0

    @property
    def trace(self):
        return self.store.get(self.request_id)

    def compose(self) -> ComposeResult:
        yield Static(id="scrub")

    def on_mount(self) -> None:
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def action_move(self, delta: int) -> None:
        self.cursor = max(0, min(len(self.trace) - 1, self.cursor + delta))
        self.redraw()

    def action_other(self, delta: int) -> None:
        ids = self.store.ids()
        if self.request_id in ids and len(ids) > 1:
            self.request_id = ids[(ids.index(self.request_id) + delta) % len(ids)]
            self.cursor = 0
            self.redraw()

    def redraw(self) -> None:
        box = self.query_one("#scrub", Static)
        box.border_title = f"Tokens of {self.request_id}"
        box.border_subtitle = "←/→ token · PgUp/PgDn ±10 · Home/End · ↑/↓ request · Esc"
        box.update(self.render_text(max(20, box.size.width - 2), max(8, box.size.height - 2)))

    def render_text(self, width: int, height: int) -> Text:
        trace = self.trace
        t = Text()
        kept = f"{len(trace)} of its {trace.num_tokens} tokens" if len(trace) < \
            trace.num_tokens else f"its {len(trace)} tokens"
        what = ["logprobs" + (" (model and after)" if trace.raw_logprobs else "")
                if trace.top else "", "speculative drafts" if any(trace.origin) else ""]
        t.append(f"{self.request_id}: {kept} · kept: {', '.join(w for w in what if w)}\n",
                 "dim")
        t.append_text(ribbon(trace, self.cursor, self.tokenizer, room=3 * width))
        t.append("\n\n")
        view = overview(trace, self.cursor, width, self.mode)
        t.append_text(view)
        t.append("\n")
        rows = height - 4 - 3 - len(view.plain.splitlines())
        return t.append_text(token_text(trace, self.cursor, self.tokenizer, self.mode, rows))


def no_trace_words(request_id: str | None, store: TraceStore) -> str:
    """Why `w` has nothing to show for the selection, and what does have a trace."""
    which = f"{request_id} has" if request_id else "no request is selected, so there is"
    held = store.ids()
    return (f"{which} no token trace: only finished requests that asked for logprobs "
            f"(typed prompts, 1 in 8 generated ones) or were verified with drafts "
            f"(speculation on: d) have one; the app keeps the latest {store.KEEP} (and "
            f"{store.KEEP_OWN} typed prompts). "
            + (f"Held: {', '.join(held[-6:])} (select one, then w)." if held else
               "None is held yet."))

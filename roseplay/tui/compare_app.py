"""The side-by-side screen of `roseplay --compare KNOB=A,B`.

Two columns, one per engine: its KV map and its timing panel (the same widgets as the
main screen), then one table with every metric on both sides and the ratio B/A
(roseplay/tui/widgets/ratios.py). A line above the columns says what is compared and what
the keys change: every control applies to both sides, except the compared knob, which
is fixed per side. Keys, the pull loop, the CPU share and loading are RoseplayApp's.

Sizes: at 120x40 both maps, both timing tables and the ratio table show; below ~16
rows for the columns the timing panels hide (the ratio table keeps their numbers), and
the note line says so; narrow tables drop their least important columns. On a live
greedy workload (`--temperature 0`) the B / A table's bottom border says how many
requests both sides finished with the same tokens (roseplay/tui/widgets/agreement.py).
"""
from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Static

from roseplay.tui.app import RoseplayApp
from roseplay.tui.commands import CompareCommands
from roseplay.tui.engine_state import engine_down, side_downs
from roseplay.tui.keys import KEYS, key_of
from roseplay.tui.widgets.agreement import TokenAgreement
from roseplay.tui.widgets.counters import CounterWindow
from roseplay.tui.widgets.events import flash_blocks
from roseplay.tui.widgets.knob_words import SHORT_NAMES, fmt_value
from roseplay.tui.widgets.knobs import live_fields
from roseplay.tui.widgets.kv_panel import KVPanel
from roseplay.tui.widgets.ratios import METRICS, RatioTable, side_metrics
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.stopped import STOP_STYLE
from roseplay.tui.widgets.timing import UPDATE_EVERY, TimingPanel

COMPARE_ACTIONS = {"pause", "resume", "step", "step_back", "seek", "seek_to", "speed", "toggle_cache",
                   "budget", "seqs", "scenario", "concurrency", "rate", "clear_cache",
                   "edit_slos", "reset_stats", "theme", "help", "quit"}
KEY_ACTIONS = {k.action.split("(")[0] for k in KEYS}
SIDE_COLORS = ("#5fb3f0", "#c792ea")
TIMING_MIN_ROWS = 16         # a column shorter than this shows its KV map only
STACKED_MIN_ROWS = 34        # tall enough for the timing plots under the table
RATIO_ROWS = 6               # three rows + header + border


class KnobNote:
    """What the Actions mixin records about the last knob touched."""
    last_changed: str | None = None


class CompareApp(RoseplayApp):
    AUTO_FOCUS = None
    COMMANDS = {CompareCommands}
    DEFAULT_CSS = """
    #scope { height: 2; padding: 0 1; background: #1d2027; text-wrap: nowrap;
             text-overflow: ellipsis; }
    #sides { height: 1fr; }
    .side { width: 1fr; }
    .side-head { height: 1; padding: 0 1; text-style: bold; text-wrap: nowrap;
                 text-overflow: ellipsis; }
    #ratios { height: 6; border: round #3d4454; border-title-color: #f2d34f;
              border-title-style: bold; padding: 0 1; }
    .side KVPanel, .side TimingPanel { border: round #3d4454; border-title-color: #f2d34f;
                                       border-title-style: bold; padding: 0 1; }
    .side TimingPanel { height: 8; }
    .side.-stopped KVPanel, .side.-stopped TimingPanel { border-subtitle-color: #ff7b7b; }
    """

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield Static("", id="scope")
        with Horizontal(id="sides"):
            for i in range(2):
                with Vertical(classes="side", id=f"side-{i}"):
                    yield Static("", classes="side-head", id=f"head-{i}", markup=False)
                    yield KVPanel(id=f"kv-{i}")
                    yield TimingPanel(id=f"timing-{i}")
        yield RatioTable(id="ratios")
        yield Static("", id="layout-note", markup=False)
        yield Footer(compact=True)

    def setup_panels(self) -> None:
        q = self.main_screen.query_one
        self.status, self.ratios, self.scope = q(StatusBar), q(RatioTable), q("#scope", Static)
        self.kvs = [q(f"#kv-{i}", KVPanel) for i in range(2)]
        self.timings = [q(f"#timing-{i}", TimingPanel) for i in range(2)]
        self.heads = [q(f"#head-{i}", Static) for i in range(2)]
        self.side_columns = [q(f"#side-{i}", Vertical) for i in range(2)]
        self.windows = [CounterWindow(), CounterWindow()]
        self._figures_at = -UPDATE_EVERY     # when the figures were last drawn (monotonic)
        self.agreement = TokenAgreement()
        self.window, self.timing = self.windows[0], self.timings[0]
        self.knobs = KnobNote()
        self.note = q("#layout-note", Static)
        self.ratios.border_title = "B / A · last 10 s"
        for panel in self.timings:
            panel.border_title = "Timing"

    def check_action(self, action: str, parameters) -> bool | None:
        """Only the keys this screen has (no request list, prompt or zoom here)."""
        if action in KEY_ACTIONS and action not in COMPARE_ACTIONS:
            return False
        return super().check_action(action, parameters)

    def unbound_note(self, name: str) -> str | None:
        k = key_of(name)
        if k is not None and k.action.split("(")[0] not in COMPARE_ACTIONS:
            return f"{k.display} ({k.label}) is not in the compare view (roseplay without " \
                   "--compare has it)"
        return super().unbound_note(name)

    # -- layout ----------------------------------------------------------------------------
    def apply_layout(self) -> None:
        if not hasattr(self, "note"):
            return
        w, h = self.size
        column = h - 1 - 2 - 2 - RATIO_ROWS - 1   # status, scope, message line + footer,
        #                                           ratios, side head
        show_timing = column >= TIMING_MIN_ROWS
        mode = "stacked" if column >= STACKED_MIN_ROWS else "stats"
        for panel in self.timings:
            panel.display = show_timing
            panel.set_mode(mode)
            panel.styles.height = 15 if mode == "stacked" else 8    # TimingStats + border
        hidden = [] if show_timing else ["timing panels (their numbers: B / A)"]
        cols = (w - 4 - 6) // 10
        if cols < len(METRICS):
            hidden.append(f"{len(METRICS) - max(1, cols)} B / A columns")
        note = f"hidden at {w}×{h}: {'; '.join(hidden)}" if hidden else ""
        note += " · ? help" if note and len(note) + 11 <= w else ""     # (cut to "· ?")
        self.laid_out(note, note)

    # -- the pull loop ---------------------------------------------------------------------
    def _unchanged(self) -> bool:
        """Every frame is drawn: the base class's test reads one engine's snapshot, and
        here either engine may have moved."""
        self._input_seen = False
        return False

    def refresh_panels(self) -> None:
        src = self.source
        if src is None:
            return
        snaps = src.snapshots()
        self.snapshot = snaps[0]
        replay = src.kind == "replay"
        if replay:              # its changes up to this frame wait for the point it makes
            self._replay_notices(src)
        metrics = []
        greedy = greedy_workload(src)
        if greedy:
            self.agreement.feed(*snaps)
        # both Timing panels and the B / A table show their figures from one frame, at
        # most every UPDATE_EVERY s while it runs (the table redrew every frame, the
        # panels every 0.5 s: a side's TTFT p50 read 1841ms above the table's 1844ms)
        now = time.monotonic()
        due = src.paused or now - self._figures_at >= UPDATE_EVERY
        if due:
            self._figures_at = now
        with self.batch_update():
            self.status.show(snaps[0], src.kind, src.paused, src.position(), None,
                             *engine_down(src))
            for i, (snap, down) in enumerate(zip(snaps, side_downs(src))):
                stop = snap.step if down[1] else None     # this side stopped for good
                self.side_columns[i].set_class(stop is not None, "-stopped")
                self.windows[i].feed(snap)
                self.kvs[i].show(snap, None, self.windows[i],
                                 flash_blocks(snap) if stop is None else None, stop)
                self.timings[i].show(snap, self.windows[i], throttle=False,
                                     final=replay and src.at_end, stopped_at=stop,
                                     hold=not due)
                if due:
                    metrics.append(side_metrics(snap, self.windows[i], self.slos,
                                                stop is not None))
                self._head(i, src, snap, stop)
            if due:
                self.ratios.show(*metrics)
            self.scope.update(scope_text(src, self.knobs.last_changed))
            subtitle = (self.agreement.text(self.ratios.outer_size.width - 6)
                        if greedy else "")   # (the border's corners and padding)
            if self.ratios.border_subtitle != subtitle:
                self.ratios.border_subtitle = subtitle

    def _head(self, i: int, src, snap, stop: int | None = None) -> None:
        """The side's label, step and counts; a side whose engine stopped has nothing in
        flight, and says after which step it stopped."""
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f" {src.labels()[i]} ", f"bold #111111 on {SIDE_COLORS[i]}")
        if stop is not None:
            t.append(f"  ■ stopped after step {stop}", STOP_STYLE)
            t.append(f" · finished {snap.counters.finished}", "bold")
        else:
            w = src.workload(i)
            t.append(f"  step {snap.step} · finished {snap.counters.finished} · in flight "
                     f"{w.get('in_flight', 0)}", "bold")
        self.heads[i].update(t)

    def mark_change(self, label: str) -> None:
        for panel, window in zip(self.timings, self.windows):
            panel.mark(label)
            window.restart()

    # -- view keys -------------------------------------------------------------------------
    def action_reset_stats(self) -> None:
        for panel in self.timings:
            panel.reset()
        self.reset_windows()
        self.agreement = TokenAgreement()
        self.notify("stats reset on both sides: the 10 s window and the plots start now",
                    timeout=3)
        self.refresh_panels()

    def reset_windows(self) -> None:
        for window, panel in zip(self.windows, self.timings):
            window.reset()
            panel.reset_shown()

    def action_theme(self) -> None:
        from roseplay.tui.widgets import theme
        theme.set_theme("default" if theme.current() != "default" else "colour-blind")
        for panel in self.timings:
            for plot in panel.plots.values():
                plot.refresh()
        if self.source is not None:
            self.refresh_panels()


def greedy_workload(src) -> bool:
    """A live compare whose workload is greedy: only then are the sides' tokens meant to
    be compared (sampled requests diverge by chance: the two engines draw apart)."""
    spec = getattr(getattr(src, "shared", None), "spec", None)
    return spec is not None and spec.temperature == 0


def scope_text(src, last_changed: str | None) -> Text:
    """What is compared, and what the keys change (both sides, except the compared knob);
    two lines, each cut at the width (the most important words first)."""
    from roseplay.tui.compare import fmt
    a, b = (fmt(v) for v in src.values)
    knobs, w = src.knobs, src.workload()
    shared = [f"{SHORT_NAMES.get(f.name, f.name)} {fmt_value(f.name, getattr(knobs, f.name))}"
              for f in live_fields() if f.name != src.knob]
    rate = w.get("rate")
    shared += [f"scenario {w.get('scenario')}", f"in flight ≤{w.get('concurrency') or '∞'}",
               f"rate {'∞' if rate is None else f'{rate:g}/s'}"]
    what = ("recorded: both sides replay on one clock" if src.kind == "replay" else
            f"keys change both sides, not {src.knob}")
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"compare {src.knob}: ", "bold")
    t.append(f"A {a}", f"bold {SIDE_COLORS[0]}")
    t.append(" · ")
    t.append(f"B {b}", f"bold {SIDE_COLORS[1]}")
    t.append(f" · {what} · one workload stream\n")
    t.append("both: ", "bold")
    t.append(" · ".join(shared) + (f" · last change: {last_changed}" if last_changed else ""),
             "dim")
    return t

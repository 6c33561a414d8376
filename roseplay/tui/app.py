"""The roseplay TUI: panels that redraw from engine snapshots, keys that turn the knobs.

The app never waits for the engine: a 12 Hz timer pulls the latest published snapshot
(`source.snapshot()` returns a reference, it never blocks) and hands it to every panel
inside one `batch_update()`; panels redraw only what changed. Keys call the source's
controls, which queue commands for the engine thread and return at once. Which panels
show, and how tall, is decided by the terminal size (roseplay/tui/layout.py); the keys are
defined once in roseplay/tui/keys.py; the actions are in roseplay/tui/actions.py.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, Static

from roseplay.tui.actions import PAUSE_ACTIONS, Actions
from roseplay.tui.marks import RecordedMarks, describe_event
from roseplay.tui.commands import RoseplayCommands
from roseplay.tui.dp_actions import MERGED_NOTE, DecisionStore
from roseplay.tui.engine_state import SERVING, engine_down, kv_events_endpoints
from roseplay.tui.keys import TEXT_ACTIONS, action_mode, bindings
from roseplay.tui.lifecycle import (SourceLoaded, error_line, exit_watchdog,
                                    install_exit_signals, remove_exit_signals, start_loading)
from roseplay.tui.layout import LEFT, RIGHT, TITLES, plan
from roseplay.tui.source_data import logprobs_mode, no_text_reason
from roseplay.tui.widgets.counters import CounterWindow
from roseplay.tui.widgets.events import EventLog, flash_blocks
from roseplay.tui.widgets.knobs import KnobsPanel
from roseplay.tui.widgets.kv_panel import KVPanel
from roseplay.tui.widgets.prompt_input import PromptBar
from roseplay.tui.widgets.replica_load import ReplicaWindows
from roseplay.tui.widgets.request_detail import RequestDetail
from roseplay.tui.widgets.routing_card import RoutingCard
from roseplay.tui.widgets.requests import ACTIVE, RequestList, seat_reasons, waiting_reason
from roseplay.tui.widgets.status import StatusBar
from roseplay.tui.widgets.step import StepPanel
from roseplay.tui.widgets.step_strip import StepStrip
from roseplay.tui.widgets.timing import TimingPanel
from roseplay.tui.widgets.token_scrub import TraceStore
from roseplay.tui.widgets.clip import clip_words
from roseplay.tui.widgets.ttft_split import request_split

REFRESH_HZ = 12
MESSAGE_SECONDS = 5.0   # a message stays on the message line this long (unless it says)
MESSAGES_KEPT = 50
MESSAGE_STYLE = {"information": ("·", "#aab2c0"), "warning": ("⚠", "bold #ff9f43"),
                 "error": ("✗", "bold #ff5555")}
HINT = "? help explains every panel and lists the guides · ctrl+p palette"
TYPING_HINT = "Enter sends the prompt · Tab: priority, sampling · Esc closes · f1 help"
UI_CPU_SHARE = 0.3      # most of one core the UI thread may use before it skips frames
PROMPT_ROWS = 4         # the open prompt box: its top border, the input, up to 2 status rows


class RoseplayApp(Actions, App):
    """`source` is a LiveSource/ReplaySource, or `source_factory` builds one off-thread."""

    CSS_PATH = "app.tcss"
    TITLE = "roseplay"
    COMMANDS = {RoseplayCommands}     # roseplay's own only: Textual's ("Theme", "Keys", …)
    #                                   named other actions than the keys of the same name
    AUTO_FOCUS = "RequestList"
    BINDINGS = bindings()

    def __init__(self, source=None, source_factory: Callable[[], object] | None = None,
                 loading_message: str = "loading the model…", refresh_hz: float = REFRESH_HZ,
                 slos: dict[str, float] | None = None):
        super().__init__()
        self.slos: dict[str, float] = dict(slos or {})   # goodput SLOs (ms): --goodput, key l
        self.source = source
        self._factory = source_factory
        self._loading_message = loading_message
        self._refresh_hz = refresh_hz
        self.snapshot = None
        self.down = SERVING             # engine_down(source) as last drawn
        self.window = CounterWindow()
        self.zoom: str | None = None
        self._cpu_window: deque = deque(maxlen=REFRESH_HZ)
        self._skipped = 0
        self._noticed = False
        self._recorded_marks = RecordedMarks()    # a replay: its knob changes on the plots
        self.load_error: str | None = None
        self.guide_results: dict[str, dict] = {}   # guide / setup key -> last measured
        self._source_closed = threading.Event()
        self.traces = TraceStore()      # token traces seen in snapshots (key w)
        self.decisions = DecisionStore()    # routing decisions kept (data parallel)
        self._message: tuple[str, str, float] = ("", "information", 0.0)
        self.messages: deque = deque(maxlen=MESSAGES_KEPT)     # (severity, text)
        self._note_shown = None
        self.layout_note = ""
        self._input_seen = False   # a key, mouse or resize event since the last frame
        self._paused_shown = False     # the state space's footer binding was drawn for
        self.step_replica: int | None = None    # data parallelism: whose step *This step* is

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield KVPanel(id="kv")
                yield StepPanel(id="step")
                yield StepStrip(id="strip")
                yield KnobsPanel(id="knobs")
            with Vertical(id="right"):
                yield RequestList(id="requests")
                yield RequestDetail(id="detail")
                yield RoutingCard(id="routing")
                yield EventLog(id="events")
                yield TimingPanel(id="timing")
        yield PromptBar(id="prompt")
        yield Static("", id="layout-note", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.main_screen = self.screen     # other screens (help, palette) may be on top
        self.setup_panels()
        self.status.kv_events = kv_events_endpoints(self.source)
        self.apply_layout()
        self.set_slos(self.slos)
        if self.source is None and self._factory is not None:
            self.status.loading(self._loading_message)
            start_loading(self, self._factory)
        if not self.is_headless:
            install_exit_signals(self, self._exit_on_signal)
        self.set_interval(1 / self._refresh_hz, self._tick)

    def setup_panels(self) -> None:
        """Find the composed panels (a subclass with other panels overrides this)."""
        q = self.main_screen.query_one
        self.status, self.requests, self.kv = q(StatusBar), q(RequestList), q(KVPanel)
        self.detail, self.step_panel, self.knobs = q(RequestDetail), q(StepPanel), q(KnobsPanel)
        self.timing, self.prompt_bar, self.events = q(TimingPanel), q(PromptBar), q(EventLog)
        self.strip, self.routing = q(StepStrip), q(RoutingCard)
        self.replica_windows = ReplicaWindows()
        self.note = q("#layout-note", Static)
        for wid, title in TITLES.items():
            q(f"#{wid}").border_title = title

    def on_source_loaded(self, event: SourceLoaded) -> None:
        if event.error is not None:      # the CLI prints it as one line
            self.load_error = error_line(event.error)
            self.exit(return_code=1)
        elif self._source_closed.is_set():
            event.source.close()         # quit while it loaded
        else:
            self.source = event.source
            self.status.kv_events = kv_events_endpoints(self.source)
            self.apply_layout()         # data parallelism: room for the routing card; the
            #                             panels are drawn once it is laid out

    def _exit_on_signal(self, signum: int) -> None:
        """SIGTERM / SIGHUP: the normal exit (the terminal is restored), code 128 + N.
        A hang-up often means the terminal is gone, and then the driver's last writes can
        block or fail forever: a watchdog ends the process if the exit has not within
        EXIT_GRACE_S (the engine is closed first either way)."""
        self.close_source()
        self.exit(return_code=128 + signum)
        exit_watchdog(128 + signum)

    def set_slos(self, slos: dict[str, float]) -> None:
        """Goodput SLOs for every timing panel (they count from the next redraw)."""
        self.slos = dict(slos)
        for panel in self.main_screen.query(TimingPanel):
            panel.slos = self.slos
            panel.reset_shown()
        if self.source is not None:
            self.refresh_panels()

    # -- layout ----------------------------------------------------------------------------
    def on_resize(self, event) -> None:
        """The app's size settles after a short debounce: lay out once it has."""
        self.set_timer(0.05, self._layout_if_resized)

    def _layout_if_resized(self) -> None:
        if getattr(self, "layout_plan", None) is not None and self.size != self._laid_out:
            self.apply_layout()

    def apply_layout(self) -> None:
        """Show the panels that fit (roseplay/tui/layout.py) and say what was hidden."""
        if not hasattr(self, "note"):
            return
        w, h = self.size
        typing = self.prompt_bar.has_class("-open")
        p = plan(w, h, self.zoom, PROMPT_ROWS if typing else 0, self.routing_rows(), typing)
        q = self.main_screen.query_one
        for pid in LEFT + RIGHT:
            widget = q(f"#{pid}")
            widget.display = pid in p.heights
            if pid in p.heights:
                widget.styles.height = p.heights[pid] if p.heights[pid] else "1fr"
        left, right = q("#left"), q("#right")
        left.display, right.display = p.left_width > 0, p.left_width < w
        left.styles.width = p.left_width
        self.timing.set_mode(p.timing)
        self.knobs.help_lines = p.knob_help_lines
        self.laid_out(p, p.note)

    def laid_out(self, plan, note: str) -> None:
        """A layout applied: its note on the message line, the plan and the size it was
        made for, and the panels drawn again once Textual has sized them (titles, legends
        and captions pick their form by their panel's width; a paused or replayed
        snapshot would not redraw them otherwise)."""
        self.layout_note = note
        self.show_message_line()
        self.layout_plan, self._laid_out = plan, self.size
        self.call_after_refresh(self.refresh_panels)

    # -- the message line ------------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Messages go to the line above the footer, not to toasts over the panels (the
        plots a guide asks you to watch were covered); `messages` keeps the latest."""
        text = f"{title}: {message}" if title else message
        self.messages.append((severity, text))
        _, shown, until = self._message
        if severity == "information" and shown != "information" and time.monotonic() < until:
            return          # a warning on the line stays until its time is up
        self._message = (text, severity, time.monotonic() + (timeout or MESSAGE_SECONDS))
        if threading.get_ident() == self._thread_id:
            self.show_message_line()

    def show_message_line(self) -> None:
        """The latest message while it lasts, else what the layout hid (or zoomed)."""
        if not hasattr(self, "note"):
            return
        text, severity, until = self._message
        line = Text(no_wrap=True, overflow="ellipsis")
        if text and time.monotonic() < until:
            mark, style = MESSAGE_STYLE.get(severity, MESSAGE_STYLE["information"])
            width = (self.note.size.width or self.size.width) - len(mark) - 2
            line.append(f"{mark} {clip_words(text, width)}", style)
        else:
            bar = getattr(self, "prompt_bar", None)        # (none on the compare screen)
            hint = TYPING_HINT if bar is not None and bar.is_open else HINT   # ? types
            line.append(self.layout_note or hint, "" if self.layout_note else "dim")
        if line != self._note_shown:
            self._note_shown = line
            self.note.update(line)

    # -- the pull loop ---------------------------------------------------------------------
    def _tick(self) -> None:
        """Timer: pull a snapshot unless the UI thread is using more than its CPU share.

        On a small CPU box a Python-bound engine shares the GIL with the UI; measuring the
        UI thread's own CPU time (rendering included) and skipping frames above
        UI_CPU_SHARE keeps the engine fast, while key presses still redraw at once.
        """
        self._follow_paused()
        now, cpu = time.monotonic(), time.thread_time()
        window = self._cpu_window
        window.append((now, cpu))
        t0, c0 = window[0]
        if now - t0 > 0.4 and (cpu - c0) / (now - t0) > UI_CPU_SHARE and self._skipped < 4:
            self._skipped += 1
            return
        self._skipped = 0
        self._layout_if_resized()
        self.show_message_line()
        if not self._unchanged():
            self.refresh_panels()

    def _unchanged(self) -> bool:
        """Nothing new to draw: the source's snapshot is the one on screen and no input
        came since (a paused engine publishes again only on a command, a step, or once a
        second: engine/core/core_loop.py PAUSED_REPUBLISH). A paused roseplay then
        redraws its panels once a second, not at the timer's rate. An engine that stops
        publishes nothing more: its client's state is compared too."""
        seen, self._input_seen = self._input_seen, False
        src = self.source
        return not seen and src is not None and self.snapshot is not None \
            and src.snapshot() is self.snapshot and engine_down(src) == self.down

    async def on_event(self, event: events.Event) -> None:
        """Every key, mouse and resize event reaches the app first (then its widgets):
        the next frame redraws whatever it changed."""
        if isinstance(event, (events.InputEvent, events.Resize)):
            self._input_seen = True
        await super().on_event(event)

    def refresh_panels(self) -> None:
        src = self.source
        if src is None:
            return
        snap, workload = src.snapshot(), src.workload()
        self.snapshot, self.down = snap, engine_down(src)
        stop = snap.step if self.down[1] else None   # stopped for good: its last step
        self.main_screen.set_class(stop is not None, "-stopped")
        replay = src.kind == "replay"
        if replay:              # its changes up to this frame wait for the point it makes
            self._replay_notices(src)
        self.window.feed(snap)
        self.traces.feed(snap, replay)
        self.feed_guide(snap)
        with self.batch_update():
            self.status.show(snap, src.kind, src.paused, src.position(), workload,
                             *self.down)
            reason = waiting_reason(snap)
            self.requests.show(snap.requests, snap.knobs.max_num_batched_tokens, reason,
                               stop is not None, pin=not replay,
                               reasons=seat_reasons(snap, reason),
                               priority=snap.knobs.scheduling_policy == "priority")
            self.requests.show_subtitle(stop)
            current = self.requests.current
            highlight = current if current is not None and current.state in ACTIVE else None
            if not self.show_replicas(snap, highlight, current, stop):
                flash = flash_blocks(snap) if stop is None else None    # nothing is new
                merged = (workload or {}).get("replicas", 0) if replay else 0
                self.kv.show(snap, highlight, self.window, flash, stop, merged)
            self.detail.show(current, getattr(src, "tokenizer", None),
                             logprobs_mode(src, snap), no_text_reason(src),
                             self._detail_extra(current, stop is not None), stop is not None)
            self.step_panel.show(snap, stop is not None, self.step_replica)
            self.strip.show(snap)
            self.events.show(snap, stop)
            self.knobs.show(src.knobs, snap.knobs, workload, replay, snap.host_num_blocks > 0)
            self.timing.show(snap, self.window, throttle=not src.paused,
                             final=replay and src.at_end, stopped_at=stop)

    def _detail_extra(self, current, stopped: bool = False):
        """The selected request's TTFT split; `w` in the panel's border when its token
        trace is held (there it fits at every size)."""
        held = current is not None and self.traces.get(current.request_id) is not None
        hint = "w tokens" if held else ""
        if self.detail.border_subtitle != hint:
            self.detail.border_subtitle = hint
        if current is None:
            return None
        return request_split(current, self.snapshot.time, max(20, self.detail.size.width),
                             stopped)

    def _replay_notices(self, src) -> None:
        if not self._noticed:
            self._noticed = True
            notice = src.notice()
            if notice:
                self.notify(notice, title="incomplete recording", severity="warning",
                            timeout=12)
            n = (src.workload() or {}).get("replicas")
            if n and src.replicas() is None:      # recorded before the replicas' frames
                self.notify(MERGED_NOTE.format(n=n), title="a data-parallel recording",
                            timeout=12)
        for event in src.take_events():
            self.notify(describe_event(event), title="recorded", timeout=3)
            label = self._recorded_marks.label(event)
            if label:                       # the mark the live app drew at this change
                self.mark_change(label)

    def on_request_list_selected(self, event: RequestList.Selected) -> None:
        """A new selection redraws at once: its KV blocks and details, not at the next tick
        (which may be skipped under CPU pressure)."""
        if self.source is not None:
            self.refresh_panels()

    def check_action(self, action: str, parameters) -> bool | None:
        """Keys of the other mode (replay keys on a live engine, the prompt in a replay)
        are hidden and do nothing. Space pauses a running source and resumes a paused
        one (the footer names which). A key that opens a text field (bound with priority:
        keys.py `takes_text`) is typed as text where a field has the focus or another
        screen is on top (help, the palette, a dialog)."""
        if action in TEXT_ACTIONS and (isinstance(self.focused, Input) or self.screen
                                       is not getattr(self, "main_screen", self.screen)):
            return False
        if action in PAUSE_ACTIONS and PAUSE_ACTIONS[action] != self.is_paused():
            return False            # space: the other of its two bindings applies
        mode = action_mode(action)
        kind = self.source.kind if self.source is not None else "live"
        return mode in ("both", kind)

    def close_source(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            src.close()
        self._source_closed.set()     # a load that ends after this closes its source

    def on_unmount(self) -> None:
        if not self.is_headless:
            remove_exit_signals()
        self.close_source()


"""The roseplay TUI: panels that redraw from engine snapshots, keys that turn the knobs.

The app never waits for the engine: a 15 Hz timer pulls the latest published snapshot
(`source.snapshot()` returns a reference, it never blocks) and hands it to every panel
inside one `batch_update()`; panels redraw only what changed. Keys call the source's
controls, which queue commands for the engine thread and return at once.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from engine.config import InvalidRequestError
from roseplay.scenarios import SCENARIOS
from roseplay.source import RATE_STEPS, ReadOnlyError
from roseplay.widgets.help import HelpScreen
from roseplay.widgets.knobs import CONCURRENCY_STEPS, KnobsPanel, next_in, stepped
from roseplay.widgets.kv_map import KVPanel
from roseplay.widgets.prompt_input import PromptBar
from roseplay.widgets.requests import ACTIVE, RequestDetail, RequestList
from roseplay.widgets.status import StatusBar
from roseplay.widgets.step import StepPanel
from roseplay.widgets.timing import TimingPanel

REFRESH_HZ = 12
UI_CPU_SHARE = 0.3      # most of one core the UI thread may use before it skips frames


class RoseplayApp(App):
    """`source` is a LiveSource/ReplaySource, or `source_factory` builds one off-thread."""

    CSS_PATH = "app.tcss"
    TITLE = "roseplay"
    ENABLE_COMMAND_PALETTE = False
    AUTO_FOCUS = "RequestList"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]
    BINDINGS = [
        Binding("space", "pause", "Pause/resume", key_display="space"),
        Binding("n", "step", "Step once"),
        Binding("b", "step_back", "Back (replay)", show=False),
        Binding("c", "toggle_cache", "Prefix cache"),
        Binding("plus,equals_sign", "budget(1)", "Budget", key_display="-/+"),
        Binding("minus,underscore", "budget(-1)", "Budget down", show=False),
        Binding("right_square_bracket", "seqs(1)", "Max seqs", key_display="[/]"),
        Binding("left_square_bracket", "seqs(-1)", "Max seqs down", show=False),
        Binding("s", "scenario(1)", "Scenario"),
        Binding("S", "scenario(-1)", "Previous scenario", show=False),
        Binding("greater_than_sign,full_stop", "concurrency(1)", "Concurrency", key_display="</>"),
        Binding("less_than_sign,comma", "concurrency(-1)", "Concurrency down", show=False),
        Binding("r", "rate", "Rate"),
        Binding("x", "clear_cache", "Clear cache"),
        Binding("i,slash", "prompt", "Prompt", key_display="i"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source=None, source_factory: Callable[[], object] | None = None,
                 loading_message: str = "loading the model…", refresh_hz: float = REFRESH_HZ):
        super().__init__()
        self.source = source
        self._factory = source_factory
        self._loading_message = loading_message
        self._refresh_hz = refresh_hz
        self.snapshot = None
        self._cpu_window: deque = deque(maxlen=REFRESH_HZ)
        self._skipped = 0
        self.load_error: str | None = None

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield KVPanel(id="kv")
                yield StepPanel(id="step")
                yield KnobsPanel(id="knobs")
            with Vertical(id="right"):
                yield RequestList(id="requests")
                yield RequestDetail(id="detail")
                yield TimingPanel(id="timing")
        yield PromptBar(id="prompt")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        q = self.screen.query_one     # keep references: other screens (help) may be on top
        self.status, self.requests, self.kv = q(StatusBar), q(RequestList), q(KVPanel)
        self.detail, self.step_panel, self.knobs = q(RequestDetail), q(StepPanel), q(KnobsPanel)
        self.timing, self.prompt_bar = q(TimingPanel), q(PromptBar)
        titles = {"kv": "KV cache", "step": "This step", "knobs": "Knobs",
                  "requests": "Requests", "detail": "Selected request", "timing": "Timing"}
        for wid, title in titles.items():
            q(f"#{wid}").border_title = title
        if self.source is None and self._factory is not None:
            self.status.loading(self._loading_message)
            self.run_worker(self._factory, thread=True, name="load", exit_on_error=False)
        self.set_interval(1 / self._refresh_hz, self._tick)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name != "load":
            return
        if event.state is WorkerState.SUCCESS:
            self.source = event.worker.result
            self.refresh_panels()
        elif event.state is WorkerState.ERROR:
            self.load_error = f"{type(event.worker.error).__name__}: {event.worker.error}"
            self.status.loading(f"could not start: {self.load_error}  (q quits)")

    # -- the pull loop ---------------------------------------------------------------------
    def _tick(self) -> None:
        """Timer: pull a snapshot unless the UI thread is using more than its CPU share.

        On a small CPU box a Python-bound engine shares the GIL with the UI; measuring the
        UI thread's own CPU time (rendering included) and skipping frames above
        UI_CPU_SHARE keeps the engine fast, while key presses still redraw at once.
        """
        now, cpu = time.monotonic(), time.thread_time()
        window = self._cpu_window
        window.append((now, cpu))
        t0, c0 = window[0]
        if now - t0 > 0.4 and (cpu - c0) / (now - t0) > UI_CPU_SHARE and self._skipped < 4:
            self._skipped += 1
            return
        self._skipped = 0
        self.refresh_panels()

    def refresh_panels(self) -> None:
        src = self.source
        if src is None:
            return
        snap, workload = src.snapshot(), src.workload()
        self.snapshot = snap
        with self.batch_update():
            self.status.show(snap, src.kind, src.paused, src.position())
            self.requests.show(snap.requests, snap.knobs.max_num_batched_tokens)
            current = self.requests.current
            highlight = current if current is not None and current.state in ACTIVE else None
            self.kv.show(snap, highlight)
            self.detail.show(current, not snap.model.startswith("dummy:"))
            self.step_panel.show(snap)
            self.knobs.show(src.knobs, snap.knobs, workload, src.kind == "replay")
            self.timing.show(snap, throttle=not src.paused)
        if src.kind == "replay":
            for event in src.take_events():
                self.notify(describe_event(event), title="recorded", timeout=3)

    def on_request_list_selected(self, event: RequestList.Selected) -> None:
        """A new selection redraws at once: its KV blocks and details, not at the next tick
        (which may be skipped under CPU pressure)."""
        if self.source is not None:
            self.refresh_panels()

    # -- actions ---------------------------------------------------------------------------
    def _control(self, fn, *args, knob: str | None = None, **kwargs):
        if self.source is None:
            self.notify("the engine is still loading", severity="warning")
            return None
        try:
            result = fn(*args, **kwargs)
        except (ReadOnlyError, InvalidRequestError, ValueError) as exc:
            self.notify(str(exc), severity="warning", timeout=3)
            return None
        if knob:
            self.knobs.last_changed = knob
        self.refresh_panels()
        return result

    def action_pause(self) -> None:
        if self.source is not None:
            self._control(self.source.resume if self.source.paused else self.source.pause)

    def action_step(self) -> None:
        if self.source is not None:
            self._control(self.source.step_once)

    def action_step_back(self) -> None:
        if self.source is not None:
            self._control(self.source.step_back)

    def action_toggle_cache(self) -> None:
        if self.source is not None:
            on = not self.source.knobs.enable_prefix_caching
            self._control(self.source.set_knobs, enable_prefix_caching=on,
                          knob="enable_prefix_caching")

    def _step_knob(self, name: str, direction: int) -> None:
        if self.source is not None:
            value = stepped(getattr(self.source.knobs, name), name, direction)
            self._control(self.source.set_knobs, **{name: value}, knob=name)

    def action_budget(self, direction: int) -> None:
        self._step_knob("max_num_batched_tokens", direction)

    def action_seqs(self, direction: int) -> None:
        self._step_knob("max_num_seqs", direction)

    def action_scenario(self, direction: int) -> None:
        if self.source is not None:
            names = list(SCENARIOS)
            cur = self.source.workload().get("scenario")
            i = names.index(cur) if cur in names else -1
            self._control(self.source.set_scenario, names[(i + direction) % len(names)],
                          knob="scenario")

    def action_concurrency(self, direction: int) -> None:
        if self.source is not None:
            cur = self.source.workload().get("concurrency") or CONCURRENCY_STEPS[-1]
            self._control(self.source.set_concurrency, next_in(CONCURRENCY_STEPS, cur, direction),
                          knob="concurrency")

    def action_rate(self) -> None:
        if self.source is not None:
            cur = self.source.workload().get("rate")
            i = RATE_STEPS.index(cur) if cur in RATE_STEPS else 0
            self._control(self.source.set_rate, RATE_STEPS[(i + 1) % len(RATE_STEPS)], knob="rate")

    def action_clear_cache(self) -> None:
        if self.source is not None and self._control(self.source.clear_prefix_cache) is None:
            if self.source.kind == "live":
                self.notify("prefix cache cleared: cached blocks are free again", timeout=2)

    def action_prompt(self) -> None:
        if self.source is not None and self.source.kind == "replay":
            self.notify("this is a replay: nothing to submit to", severity="warning", timeout=3)
            return
        self.prompt_bar.open()

    def on_prompt_bar_submitted(self, event: PromptBar.Submitted) -> None:
        bar = self.prompt_bar
        if self.source is None:
            bar.show_error("the engine is still loading")
            return
        try:
            rid = self.source.submit(event.text)
        except (InvalidRequestError, ReadOnlyError, RuntimeError) as exc:
            bar.show_error(str(exc))
            return
        bar.show_ok(f"submitted as {rid}: it is selected in the request list")
        self.requests.pending = rid

    def on_prompt_bar_closed(self, event: PromptBar.Closed) -> None:
        self.requests.focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS, self._refresh_hz))

    async def action_quit(self) -> None:
        self.close_source()
        self.exit()

    def close_source(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            src.close()

    def on_unmount(self) -> None:
        self.close_source()


def describe_event(event: dict) -> str:
    what = event.get("what", "?")
    data = {k: v for k, v in event.items() if k not in ("kind", "t", "what")}
    detail = ", ".join(f"{k}={v}" for k, v in data.items())
    return f"{event.get('t', 0):.1f} s: {what}{f' ({detail})' if detail else ''}"

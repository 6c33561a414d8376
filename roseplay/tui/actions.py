"""What the keys and the command palette do (a mixin of RoseplayApp).

Each action calls one control of the source (roseplay/workload/source.py), which validates and
queues it for the engine thread; refusals (a replay, an invalid knob value) become a
warning toast, never an exception.
"""
from __future__ import annotations

from engine.codes import RUNNING_STATES
from engine.config import InvalidRequestError
from roseplay.tui.guide_actions import GuideActions
from roseplay.tui.keys import other_mode_note
from roseplay.tui.layout import TITLES, ZOOM_ORDER
from roseplay.tui.marks import RecordedMarks, change_label
from roseplay.tui.source_data import logprobs_mode
from roseplay.workload.scenarios import SCENARIOS
from roseplay.tui.dp_actions import RoutingActions
from roseplay.workload.source import RATE_STEPS, ReadOnlyError, ReplaySource
from roseplay.tui.widgets import theme
from roseplay.tui.widgets.help import HelpScreen
from roseplay.tui.widgets.prompt_input import parse_sampling
from roseplay.tui.widgets.knobs import (CONCURRENCY_STEPS, cycled, knob_bounds, knob_field,
                                        live_fields, next_in, stepped)
from roseplay.tui.widgets.requests import FILTERS, SORTS

PAUSE_ACTIONS = {"pause": False, "resume": True}   # space's two bindings: the state each is for
WORKLOAD_SETTERS = {"scenario": "set_scenario", "concurrency": "set_concurrency",
                    "rate": "set_rate"}


class Actions(GuideActions, RoutingActions):
    def _control(self, fn, *args, knob: str | None = None, label: str | None = None,
                 **kwargs):
        if self.source is None:
            self.notify("the engine is still loading", severity="warning")
            return None
        if label is None and knob in kwargs and kwargs[knob] == getattr(self.source.knobs,
                                                                       knob, None):
            # a key at a knob's limit changes nothing: no mark, the 10 s figures go on
            self.notify(f"{knob} is already {kwargs[knob]}: at its limit", timeout=3)
            return None
        try:
            result = fn(*args, **kwargs)
        except (ReadOnlyError, InvalidRequestError, ValueError) as exc:
            self.notify(str(exc), severity="warning", timeout=4)
            return None
        if knob:
            self.knobs.last_changed = knob
            self.mark_change(label or change_label(self.source, knob))
            if label is None:           # a user's change (a guide's own changes: `label`)
                self.guide_turned()
                self.explain(knob)
        self.refresh_panels()
        return result

    def explain(self, knob: str) -> None:
        """What the knob just turned does, on the message line (the Knobs panel has
        room for it only on a tall screen)."""
        help_line = getattr(self.knobs, "help_line", None)
        if help_line is not None and self.source is not None:
            self.notify(help_line(False, self.source.workload(), self.source.knobs), timeout=8)

    def mark_change(self, label: str) -> None:
        """A mark with `label` on the time series where a knob changed; the 10 s figures
        start again there (they would mix both setups for 10 s)."""
        self.timing.mark(label)
        self.window.restart()

    # -- engine ----------------------------------------------------------------------------
    def action_pause(self) -> None:
        if self.source is not None:
            self._control(self.source.pause)

    def action_resume(self) -> None:
        if self.source is not None:
            self._control(self.source.resume)

    def on_key(self, event) -> None:
        """A key that reached the app with its binding off said nothing: the message
        line says where it acts (`c` in a replay, `b` on a live engine)."""
        if self.source is None or self.screen is not self.main_screen:
            return
        note = self.unbound_note(event.key)
        if note:
            self.notify(note, timeout=5)

    def unbound_note(self, name: str) -> str | None:
        return other_mode_note(name, self.source.kind)

    def is_paused(self) -> bool:
        return self.source is not None and self.source.paused

    def _follow_paused(self) -> None:
        """Space's binding follows the source: `n`, a replay's end and a guide pause it
        too, so the footer is refreshed whenever the state changes, not on the key."""
        if self.is_paused() != self._paused_shown:
            self._paused_shown = self.is_paused()
            self.refresh_bindings()

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

    def budget_cap(self) -> int | None:
        """The budget's upper bound: the tokens the whole KV pool holds (a step cannot
        compute more KV than the pool stores)."""
        info = getattr(self.source, "info", None)
        return info.num_blocks * info.block_size if info is not None else None

    def action_budget(self, direction: int) -> None:
        if self.source is None:
            return
        old, cap = self.source.knobs.max_num_batched_tokens, self.budget_cap()
        new = stepped(old, "max_num_batched_tokens", direction, cap)
        if direction > 0 and new <= old:       # at the cap (or above it, from the CLI)
            self.notify(f"the token budget is at its cap: {old} tokens (the KV pool holds "
                        f"{cap or old})", severity="warning", timeout=4)
            return
        if self._control(self.source.set_knobs, max_num_batched_tokens=new,
                         knob="max_num_batched_tokens") is not None:
            self._warn_small_budget(new)

    def _warn_small_budget(self, budget: int) -> None:
        running = sum(r.state in RUNNING_STATES
                      for r in (self.snapshot.requests if self.snapshot else ()))
        if budget < running:
            self.notify(f"budget {budget} < {running} running requests: only {budget} of them "
                        f"decode per step, prefill waits", severity="warning", timeout=5)

    def action_seqs(self, direction: int) -> None:
        if self.source is not None:
            value = stepped(self.source.knobs.max_num_seqs, "max_num_seqs", direction)
            self._control(self.source.set_knobs, max_num_seqs=value, knob="max_num_seqs")

    def action_spec_tokens(self, direction: int) -> None:
        """Speculative decoding's k, one at a time within the knob's bounds (0: off; the
        engine's MAX_SPECULATIVE_TOKENS at most), from the next step."""
        if self.source is not None:
            k = self.source.knobs.num_speculative_tokens
            low, top = knob_bounds("num_speculative_tokens")
            new = max(low, min(top, k + direction))
            self._control(self.source.set_knobs, num_speculative_tokens=new,
                          knob="num_speculative_tokens")

    def action_cycle_knob(self, name: str, direction: int) -> None:
        """The next value of a choice-valued knob (its `choices` in engine/config.py)."""
        if self.source is not None:
            choices = knob_field(name).metadata["choices"]
            new = cycled(choices, getattr(self.source.knobs, name), direction, missing=0)
            self._control(self.source.set_knobs, **{name: new}, knob=name)

    def action_clear_cache(self) -> None:
        if self.source is not None and self._control(self.source.clear_prefix_cache) is None:
            if self.source.kind == "live":
                self.notify("prefix cache cleared: cached blocks are free again", timeout=2)

    # -- workload --------------------------------------------------------------------------
    def action_scenario(self, direction: int) -> None:
        if self.source is not None:
            new = cycled(SCENARIOS, self.source.workload().get("scenario"), direction)
            self._control(self.source.set_scenario, new, knob="scenario")

    def action_concurrency(self, direction: int) -> None:
        if self.source is not None:
            cur = self.source.workload().get("concurrency") or CONCURRENCY_STEPS[-1]
            self._control(self.source.set_concurrency, next_in(CONCURRENCY_STEPS, cur, direction),
                          knob="concurrency")

    def action_rate(self, direction: int) -> None:
        if self.source is not None:
            new = cycled(RATE_STEPS, self.source.workload().get("rate"), direction, missing=0)
            self._control(self.source.set_rate, new, knob="rate")

    def set_value(self, name: str, text: str) -> None:
        """A typed value (command palette): a live knob, a workload setting, or replay
        speed / seek; checked like the CLI's flags (roseplay/cli_flags.py)."""
        from roseplay.cli_flags import parse_knob_value
        if self.source is None:
            return
        try:
            if name in {f.name for f in live_fields()}:
                value = parse_knob_value(name, text)
                cap = self.budget_cap() if name == "max_num_batched_tokens" else None
                if cap and value > cap:     # the cap `+` stops at
                    raise ValueError(f"{value} is more than the KV pool holds ({cap} tokens: "
                                     f"a step cannot compute more KV than it stores); at "
                                     f"most {cap}")
                self._control(self.source.set_knobs, **{name: value}, knob=name)
            elif name in WORKLOAD_SETTERS:
                value = _workload_value(name, text)
                self._control(getattr(self.source, WORKLOAD_SETTERS[name]), value, knob=name)
            elif name in ("speed", "seek") and isinstance(self.source, ReplaySource):
                fn = self.source.set_speed if name == "speed" else self.source.seek_by
                self._control(fn, float(text))
                if name == "seek":
                    self.replay_history()
        except ValueError as exc:
            self.notify(f"{name}: {exc}", severity="warning", timeout=4)

    def action_prompt(self) -> None:
        self.prompt_bar.open()
        self.apply_layout()

    def on_prompt_bar_submitted(self, event) -> None:
        bar = self.prompt_bar
        if self.source is None:
            bar.show_error("the engine is still loading")
            return
        try:
            kw = {"sampling": parse_sampling(event.sampling)} if event.sampling.strip() else {}
            rid = self.source.submit(event.text, priority=event.priority, **kw)
        except (InvalidRequestError, ReadOnlyError, RuntimeError) as exc:
            bar.show_error(str(exc))
            return
        bar.show_ok(f"submitted as {rid} (priority {event.priority}): it is selected in the "
                    f"request list")
        self.requests.pending = rid

    def on_prompt_bar_closed(self, event) -> None:
        self.apply_layout()
        self.requests.focus()

    # -- replay ------------------------------------------------------------------------------
    def action_seek(self, seconds: float) -> None:
        self._control(self.source.seek_by, seconds)
        self.replay_history()

    def action_seek_to(self, index: int) -> None:
        self._control(self.source.seek, index if index >= 0 else len(self.source.recording) - 1)
        self.replay_history()

    def replay_history(self) -> None:
        """After a seek: the plots' history up to the new position, from the recording
        (the plots would otherwise start empty, or bridge the jump with one point)."""
        from roseplay.tui.widgets.timing import BUCKET, HISTORY
        src = self.source
        if not isinstance(src, ReplaySource):
            return
        entries, end = src.recording.entries, src.index
        since, last = entries[end].t - HISTORY * BUCKET, None
        history = self.timing.history
        history.reset()
        labels: list[str] = []      # the recorded knob changes since the last point fed
        marks = RecordedMarks()
        for i, entry in enumerate(entries[:end + 1]):
            if entry.t >= since:
                labels += filter(None, map(marks.label, entry.events))
            if entry.t < since or (last is not None and entry.t - last < BUCKET / 2
                                   and i < end):
                continue
            for label in labels:
                history.mark(label)
            labels = []
            history.feed(src.recording[i].snapshot, i == end)    # two frames a point: < 0.5 s
            last = entry.t                              # for 2 minutes of history
        self.timing.reset_shown()
        self.refresh_panels()

    def action_speed(self, direction: int) -> None:
        speeds = ReplaySource.SPEEDS
        self._control(self.source.set_speed, next_in(speeds, self.source.speed, direction))

    # -- view --------------------------------------------------------------------------------
    def action_sort(self, direction: int) -> None:
        keys = list(SORTS)
        self.set_sort(keys[(keys.index(self.requests.sort) + direction) % len(keys)])

    def set_sort(self, key: str) -> None:
        self.requests.sort = key
        self._view_changed()

    def action_filter(self, direction: int) -> None:
        i = FILTERS.index(self.requests.state_filter)
        self.set_filter(FILTERS[(i + direction) % len(FILTERS)])

    def set_filter(self, state: str | None) -> None:
        self.requests.state_filter = state
        self._view_changed()

    def _view_changed(self) -> None:
        if self.source is not None:
            self.refresh_panels()

    def action_zoom(self, direction: int) -> None:
        if direction == 0:
            self.set_zoom(None)
            return
        order = [p for p in ZOOM_ORDER if p != "routing" or self.routing_rows()]
        i = order.index(self.zoom) if self.zoom in order else -1
        self.set_zoom(order[i + 1] if i + 1 < len(order) else None)

    def set_zoom(self, panel: str | None) -> None:
        self.zoom = panel if panel in TITLES else None
        self.apply_layout()         # (which redraws the panels at their new sizes)

    def action_scrub(self) -> None:
        """The selected request's token trace, token by token; without one, a warning
        says which requests have one and names those held."""
        from roseplay.tui.widgets.token_scrub import TokenScrubScreen, no_trace_words
        current = self.requests.current
        rid = current.request_id if current is not None else None
        if self.traces.get(rid) is None:
            self.notify(no_trace_words(rid, self.traces), severity="warning", timeout=8)
            return
        mode = logprobs_mode(self.source, self.snapshot) or ""
        self.push_screen(TokenScrubScreen(self.traces, rid, getattr(self.source, "tokenizer",
                                                                    None), mode))

    def action_reset_stats(self) -> None:
        """Totals, the 10 s window and the plots start now."""
        self.reset_windows()
        self.timing.reset()
        self.notify("stats reset: totals, the 10 s window and the plots start now", timeout=3)
        if self.source is not None:
            self.refresh_panels()

    def reset_windows(self) -> None:
        """Totals, the 10 s window and the KV peak start now."""
        self.window.reset()
        self.timing.reset_shown()

    def action_theme(self) -> None:
        theme.set_theme("default" if theme.current() != "default" else "colour-blind")
        self.notify(f"theme: {theme.current()}", timeout=2)
        for plot in self.timing.plots.values():
            plot.refresh()
        if self.source is not None:
            self.refresh_panels()

    def action_edit_slos(self) -> None:
        from roseplay.tui.widgets.slo_input import SloScreen
        if not isinstance(self.screen, SloScreen):
            self.push_screen(SloScreen(self.slos), self._slos_entered)

    def set_slos_text(self, text: str) -> None:
        """`goodput ttft:200 tpot:50` typed in the palette (an empty text clears)."""
        from engine.metrics import parse_slos
        try:
            slos = parse_slos(text.replace(",", " ").split())
        except ValueError as exc:
            self.notify(str(exc), severity="warning", timeout=4)
            return
        self._slos_entered(slos)

    def _slos_entered(self, slos: dict | None) -> None:
        if slos is not None:
            from roseplay.tui.widgets.slo_input import describe
            self.set_slos(slos)
            self.notify(describe(slos), timeout=3)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            kind = self.source.kind if self.source is not None else "live"
            self.push_screen(HelpScreen(kind, self._refresh_hz))

    async def action_quit(self) -> None:
        self.close_source()
        self.exit()


def _workload_value(name: str, text: str):
    if name == "scenario":
        return text
    if name == "rate" and text.lower() in ("inf", "∞", "none", "max"):
        return None
    try:
        return int(text) if name == "concurrency" else float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None

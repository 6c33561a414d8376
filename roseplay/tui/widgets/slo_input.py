"""The goodput SLO editor (key `l`): type `ttft:200 tpot:50 e2el:2000` (ms), Enter sets.

The same spelling as `--goodput` on the command line (engine.metrics.parse_slos reads
both); an empty line clears the SLOs. A bad entry stays on screen with the reason.
"""
from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from engine.metrics import parse_slos
from roseplay.tui.widgets.prompt_input import Field
from roseplay.tui.widgets.timing import slo_text


class SloScreen(ModalScreen):
    """Dismissed with the new SLOs ({} clears them), or None on Esc."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    SloScreen { align: center middle; }
    SloScreen > Vertical { width: 72; height: auto; border: round $accent;
                           background: $surface; padding: 0 1; }
    SloScreen Input { height: 1; padding: 0; }
    SloScreen #slo-status { color: $text-muted; }
    SloScreen #slo-status.-error { color: $error; text-style: bold; }
    """

    def __init__(self, slos: dict[str, float], **kwargs):
        super().__init__(**kwargs)
        self._slos = slos

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("[b]Goodput SLOs[/b] (ms): a request is [i]good[/i] when it meets all")
            yield Field(" ".join(f"{k}:{v:g}" for k, v in self._slos.items()),
                        placeholder="ttft:200 tpot:50 e2el:2000", compact=True, id="slo-input")
            yield Static("keys ttft, tpot, e2el; Enter sets, an empty line clears, Esc cancels",
                         id="slo-status", markup=False)

    def on_mount(self) -> None:
        self.set_focus(self.query_one(Input))

    def on_key(self, event: events.Key) -> None:
        """A letter the screen itself gets was typed right after `l`, before the field
        had the focus (the field takes every letter after): it goes into the field."""
        if event.is_printable:
            event.stop()
            self.query_one(Input).insert_text_at_cursor(event.character)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            slos = parse_slos(event.value.replace(",", " ").split())
        except ValueError as exc:
            status = self.query_one("#slo-status", Static)
            status.update(f"✗ {exc}")
            status.add_class("-error")
            return
        self.dismiss(slos)


def describe(slos: dict[str, float]) -> str:
    return f"goodput SLOs: {slo_text(slos)}" if slos else "goodput SLOs cleared"

"""The prompt box: type a prompt, Enter submits it, the line below shows the outcome.

The box sits in the normal flow above the footer (not docked: two widgets docked to the
bottom overlap, which hid the status line), and the Input is Textual's compact variant
(no border in any state: a focused Input's `tall` border left a 1-row box no room).
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Static

MAX_PROMPT_CHARS = 20000     # longer pastes are cut by the box itself (the engine checks tokens)


class PromptBar(Vertical):
    """Hidden until opened; errors (InvalidRequestError) stay on screen under the box."""

    DEFAULT_CSS = """
    PromptBar { height: auto; display: none; border-top: tall $accent;
                background: $panel; padding: 0 1; }
    PromptBar.-open { display: block; }
    PromptBar > Input { height: 1; padding: 0; }
    PromptBar > #prompt-status { height: auto; max-height: 2; color: $text-muted; }
    PromptBar > #prompt-status.-error { color: $error; text-style: bold; }
    """
    BINDINGS = [Binding("escape", "close", "Close prompt", key_display="esc")]

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    class Closed(Message):
        pass

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Type a prompt, Enter sends it to the engine (Esc closes)",
                    id="prompt-input", compact=True, max_length=MAX_PROMPT_CHARS)
        yield Static("", id="prompt-status", markup=False)

    def open(self) -> None:
        self.add_class("-open")
        self.query_one(Input).focus()

    def action_close(self) -> None:
        self.remove_class("-open")
        self.app.set_focus(None)
        self.post_message(self.Closed())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Submitted(event.value))

    def show_error(self, message: str) -> None:
        status = self.query_one("#prompt-status", Static)
        status.update(f"✗ {message.splitlines()[0] if message else 'error'}")
        status.add_class("-error")

    def show_ok(self, message: str) -> None:
        status = self.query_one("#prompt-status", Static)
        status.update(f"✓ {message}")
        status.remove_class("-error")
        self.query_one(Input).value = ""

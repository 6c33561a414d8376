"""The prompt box: type a prompt, Enter submits it, the line below shows the outcome.

The box sits in the normal flow above the footer (not docked: two widgets docked to the
bottom overlap, which hid the status line), and the Input is Textual's compact variant
(no border in any state: a focused Input's `tall` border left a 1-row box no room).
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Static

MAX_PROMPT_CHARS = 20000     # longer pastes are cut by the box itself (the engine checks tokens)


SAMPLING_FIELDS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float,
                   "presence_penalty": float, "frequency_penalty": float,
                   "repetition_penalty": float, "min_tokens": int, "max_tokens": int,
                   "seed": int}


def parse_sampling(text: str) -> dict:
    """"name=value ..." -> SamplingParams fields (logit_bias=id:bias,id:bias); a wrong
    name or value raises InvalidRequestError (SamplingParams checks the ranges)."""
    from engine.config import InvalidRequestError
    out: dict = {}
    for item in text.split():
        name, _, value = item.partition("=")
        if name != "logit_bias" and name not in SAMPLING_FIELDS:
            raise InvalidRequestError(f"unknown sampling field {name!r} (one of "
                                      f"{', '.join([*SAMPLING_FIELDS, 'logit_bias'])})")
        try:
            if name == "logit_bias":
                out[name] = {int(k): float(v) for k, v in
                             (pair.split(":") for pair in value.split(","))}
            else:
                out[name] = SAMPLING_FIELDS[name](value)
        except ValueError:
            raise InvalidRequestError(f"bad value for {name}: {value!r}") from None
    return out


class PromptBar(Vertical):
    """Hidden until opened; errors (InvalidRequestError) stay on screen under the box."""

    DEFAULT_CSS = """
    PromptBar { height: auto; display: none; border-top: tall $accent;
                background: $panel; padding: 0 1; }
    PromptBar.-open { display: block; }
    PromptBar > Horizontal { height: 1; }
    PromptBar Input { height: 1; padding: 0; }
    PromptBar #prompt-input { width: 1fr; }
    PromptBar #prompt-priority { width: 14; margin-left: 1; }
    PromptBar #prompt-sampling { width: 40; margin-left: 1; }
    PromptBar > #prompt-status { height: auto; max-height: 2; color: $text-muted; }
    PromptBar > #prompt-status.-error { color: $error; text-style: bold; }
    """
    BINDINGS = [Binding("escape", "close", "Close prompt", key_display="esc")]

    class Submitted(Message):
        def __init__(self, text: str, priority: int = 0, sampling: str = ""):
            super().__init__()
            self.text = text
            self.priority = priority     # scheduling_policy=priority: lower goes first
            self.sampling = sampling     # "name=value ..." SamplingParams fields (parse_sampling)

    class Closed(Message):
        pass

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Input(placeholder="Type a prompt, Enter sends it to the engine (Tab: its "
                                    "priority, Esc closes)",
                        id="prompt-input", compact=True, max_length=MAX_PROMPT_CHARS)
            yield Input(placeholder="priority 0", id="prompt-priority", compact=True,
                        type="integer", max_length=11, tooltip="scheduling_policy=priority: "
                        "lower goes first (the workload's chat turns are 0, documents 1)")
            yield Input(placeholder="sampling: frequency_penalty=1 logit_bias=42:5",
                        id="prompt-sampling", compact=True, max_length=400,
                        tooltip="SamplingParams fields as name=value (vLLM names): "
                        "temperature, top_k, top_p, min_p, presence_penalty, "
                        "frequency_penalty, repetition_penalty, min_tokens, max_tokens, "
                        "seed, logit_bias=id:bias,id:bias. The Selected panel shows the "
                        "model's distribution beside the one sampled from.")
        yield Static("", id="prompt-status", markup=False)

    def open(self) -> None:
        self.add_class("-open")
        self.query_one("#prompt-input", Input).focus()

    @property
    def priority(self) -> int:
        text = self.query_one("#prompt-priority", Input).value.strip()
        return int(text) if text.lstrip("-").isdigit() else 0

    def action_close(self) -> None:
        self.remove_class("-open")
        self.app.set_focus(None)
        self.post_message(self.Closed())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in either box sends the prompt with the priority typed (0 if none)."""
        event.stop()
        self.post_message(self.Submitted(self.query_one("#prompt-input", Input).value,
                                          self.priority,
                                          self.query_one("#prompt-sampling", Input).value))

    def show_error(self, message: str) -> None:
        status = self.query_one("#prompt-status", Static)
        status.update(f"✗ {message.splitlines()[0] if message else 'error'}")
        status.add_class("-error")

    def show_ok(self, message: str) -> None:
        status = self.query_one("#prompt-status", Static)
        status.update(f"✓ {message}")
        status.remove_class("-error")
        self.query_one("#prompt-input", Input).value = ""

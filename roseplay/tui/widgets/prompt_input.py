"""The prompt box: type a prompt, Enter submits it, the line below shows the outcome.

The box sits in the normal flow above the footer (not docked: two widgets docked to the
bottom overlap, which hid the status line), and the Input is Textual's compact variant
(no border in any state: a focused Input's `tall` border left a 1-row box no room).

While the box is open the keys belong to it: Tab and Shift+Tab cycle its three fields
(they used to move the focus out of the box, and the next letters typed turned knobs;
a field keeps its text when Tab comes back to it),
and a click elsewhere closes it (the typed text stays for the next `i`).
"""
from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Static

MAX_PROMPT_CHARS = 20000     # longer pastes are cut by the box itself (the engine checks tokens)


class Field(Input):
    """An Input whose own editing keys (backspace, ←/→, ctrl+u, Enter …) act in the order
    they were typed. Textual inserts a letter as the field takes the key but runs the
    field's bindings only once the key has bubbled up to the App, after the letters typed
    right behind it: fast typing, a paste or a loaded CPU turned `ROMEO` ⌫⌫ `XY` into
    `ROMEO`, and ctrl+u then new sampling fields into an empty field sent as typed."""

    def __init__(self, *args, forms: tuple[str, ...] = (), **kwargs):
        """`forms`: placeholders, longest first: the longest that fits shows (80x24
        cut the prompt field's to `prompt · Enter sends · Tab:`)."""
        super().__init__(*args, **kwargs)
        self.forms = forms

    def on_resize(self) -> None:
        if self.forms:          # (a cell for the cursor)
            self.placeholder = next((f for f in self.forms if len(f) < self.size.width),
                                    self.forms[-1])

    async def _on_key(self, event: events.Key) -> None:
        """Before Input's own handler (Textual calls each class's along the MRO, until
        one prevents the default): a bound key runs here, as it arrives."""
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if not binding.priority and await self.app.run_action(binding.action, self):
                event.stop()
                event.prevent_default()
                return


PROMPT_FORMS = ("prompt · Enter sends · Tab: priority, sampling · Esc",
                "prompt · Enter sends · Esc closes", "prompt · Enter sends · Esc",
                "prompt · Enter sends")
SAMPLING_FIELDS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float,
                   "presence_penalty": float, "frequency_penalty": float,
                   "repetition_penalty": float, "min_tokens": int, "max_tokens": int,
                   "seed": int}


STRUCTURED_FIELDS = ("json", "regex", "choice")   # structured outputs (one of them)


def parse_sampling(text: str) -> dict:
    """"name=value ..." -> SamplingParams fields (logit_bias=id:bias,id:bias); a wrong
    name or value raises InvalidRequestError (SamplingParams checks the ranges). A
    constraint (docs/STRUCTURED_OUTPUTS.md): `json` (any JSON object), `json=SCHEMA` (a
    JSON schema written without spaces), `regex=RE` or `choice=a|b|c`."""
    from engine.config import InvalidRequestError
    out: dict = {}
    for item in text.split():
        name, _, value = item.partition("=")
        if name in STRUCTURED_FIELDS:
            out["structured_outputs"] = _constraint(name, value)
            continue
        if name != "logit_bias" and name not in SAMPLING_FIELDS:
            names = [*SAMPLING_FIELDS, "logit_bias", *STRUCTURED_FIELDS]
            raise InvalidRequestError(f"unknown sampling field {name!r} (one of "
                                      f"{', '.join(names)})")
        try:
            if name == "logit_bias":
                out[name] = {int(k): float(v) for k, v in
                             (pair.split(":") for pair in value.split(","))}
            else:
                out[name] = SAMPLING_FIELDS[name](value)
        except ValueError:
            raise InvalidRequestError(f"bad value for {name}: {value!r}") from None
    return out


def _constraint(name: str, value: str) -> dict:
    if name == "json":
        return {"json": value} if value else {"json_object": True}
    if name == "choice":
        return {"choice": value.split("|")}
    return {name: value}


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
    PromptBar #prompt-sampling { width: 1fr; max-width: 40; margin-left: 1; }
    PromptBar > #prompt-status { height: auto; max-height: 2; color: $text-muted; }
    PromptBar > #prompt-status.-error { color: $error; text-style: bold; }
    """
    BINDINGS = [Binding("escape", "close", "Close prompt", key_display="esc"),
                # priority: the app runs them as the key arrives, so letters typed
                # after a Tab land in the field it reaches, not in the one whose
                # queue still held the Tab
                Binding("tab", "cycle(1)", "Next field", show=False, priority=True),
                Binding("shift+tab", "cycle(-1)", "Previous field", show=False,
                        priority=True)]
    FIELDS = ("#prompt-input", "#prompt-priority", "#prompt-sampling")

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
            yield Field(placeholder=PROMPT_FORMS[0], forms=PROMPT_FORMS, id="prompt-input",
                        compact=True, max_length=MAX_PROMPT_CHARS, select_on_focus=False)
            yield Field(placeholder="priority 0", id="prompt-priority", compact=True,
                        select_on_focus=False, type="integer", max_length=11, tooltip="scheduling_policy=priority: "
                        "lower goes first (the workload's chat turns are 0, documents 1)")
            yield Field(placeholder="sampling: temperature=0 json …",
                        id="prompt-sampling", compact=True, max_length=400,
                        select_on_focus=False,
                        tooltip="SamplingParams fields as name=value (vLLM names): "
                        "temperature, top_k, top_p, min_p, presence_penalty, "
                        "frequency_penalty, repetition_penalty, min_tokens, max_tokens, "
                        "seed, logit_bias=id:bias,id:bias. The Selected panel shows the "
                        "model's distribution beside the one sampled from.")
        yield Static("", id="prompt-status", markup=False)

    def open(self) -> None:
        """Show the box with the focus in its prompt field at once (not after the next
        redraw, as Widget.focus does): what is typed right after `i` is the prompt's,
        never the app's keys (`h`, `e` change knobs, `l` opens the SLO dialog)."""
        self.add_class("-open")
        self.screen.set_focus(self.query_one("#prompt-input", Input))

    @property
    def priority(self) -> int:
        text = self.query_one("#prompt-priority", Input).value.strip()
        return int(text) if text.lstrip("-").isdigit() else 0

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def action_close(self) -> None:
        if not self.is_open:
            return
        self.remove_class("-open")
        if self.app.focused is not None and self in self.app.focused.ancestors:
            self.app.set_focus(None)
        self.post_message(self.Closed())

    def action_cycle(self, step: int) -> None:
        """Tab / Shift+Tab: the next / previous field of the box, wrapping around. The
        focus moves now, not after the next redraw (Widget.focus): a second Tab typed
        before it moves on from this one's field."""
        fields = [self.query_one(f, Input) for f in self.FIELDS]
        focused = self.app.focused
        i = fields.index(focused) if focused in fields else -1
        self.screen.set_focus(fields[(i + step) % len(fields)])

    def on_descendant_blur(self, event) -> None:
        """Focus left a field: once it has settled, close the box if the focus went
        outside it on this screen (a click on a panel). A screen on top (help, palette)
        and the terminal losing focus (no widget focused until it comes back) keep it."""
        self.call_after_refresh(self._close_if_left)

    def _close_if_left(self) -> None:
        focused = self.app.focused
        if not self.is_open or self.app.screen is not self.screen:
            return
        if focused is not None and self not in focused.ancestors:
            self.action_close()

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
        prompt = self.query_one("#prompt-input", Input)
        prompt.value = ""
        # the next prompt is typed there: Enter sent from the sampling field left the
        # focus in it, and the next prompt's words went into the sampling fields
        self.screen.set_focus(prompt)

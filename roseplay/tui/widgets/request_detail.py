"""The selected request: its prompt (dim), its output text as it streams, and under it
its TTFT split, its grammar's last mask (a constrained request: grammar_line.py) and
its next-token distribution (token_choice.py)."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from roseplay.tui.widgets.grammar_line import grammar_rows, grammar_text
from roseplay.tui.widgets.requests import ACTIVE, STATE_STYLE
from roseplay.tui.widgets.stopped import CUT_OFF, CUT_STYLE
from roseplay.tui.widgets.token_choice import choice_text


def output_text(r, tokenizer) -> str:
    """The text of a request's last output tokens ("…" first when older ones are cut)."""
    if tokenizer is None or not r.output_tail:
        return ""
    text = tokenizer.decode(list(r.output_tail), skip_special_tokens=True)
    return ("…" + text) if r.output_tokens > len(r.output_tail) else text


class RequestDetail(Widget):
    """The selected request: prompt (dim), its output text as it streams, and the rows
    under it (TTFT split, grammar, next token)."""

    DEFAULT_CSS = "RequestDetail { height: 6; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()

    def show(self, r, tokenizer=None, logprobs_mode: str | None = None,
             no_text: str = "this model has no tokenizer: no text",
             extra: Text | None = None, stopped: bool = False) -> None:
        """tokenizer: decodes the request's last output tokens (the engine sends ids; a
        recording carries the text and its tokens' pieces); logprobs_mode: what the
        requests' logprobs hold, to show the next-token distribution (None: not known);
        no_text: why a request with output tokens has no text; extra: lines under the
        text (its TTFT split), rows kept for them; stopped: the engine stopped for good,
        so a request in flight reads cut off (no cursor: nothing more comes)."""
        t = Text(overflow="fold")
        if r is None:
            t.append("Select a request with ↑/↓ (or a click); Esc follows the first active one.", "dim")
        else:
            # the prompt gets at most half the lines: the output always shows (80x24: 3)
            width, lines = max(20, self.size.width), max(2, self.size.height)
            choice_rows = 0 if logprobs_mode is None else 1 if lines < 12 else \
                9 if getattr(r.logprobs, "raw", None) else 6     # + headers, 6 tokens
            extra_rows = 0 if extra is None else min(2, -(-extra.cell_len // width),
                                                     lines - choice_rows - 2)
            if extra is not None and extra_rows < 1:    # a small panel: the split gives way
                extra, extra_rows = None, 0
            elif extra is not None and extra.cell_len > width * extra_rows:
                extra = extra.copy()
                extra.truncate(width * extra_rows, overflow="ellipsis")
            grammar = getattr(r, "grammar", None)      # (recordings carry none)
            g_rows = grammar_rows(grammar, lines - choice_rows - extra_rows)
            lines = max(2, lines - choice_rows - extra_rows - g_rows)
            prompt_lines = max(1, lines // 2)
            cut = stopped and r.state in ACTIVE
            state = f"{CUT_OFF} while {r.state}" if cut else r.state
            style = CUT_STYLE if cut else STATE_STYLE.get(r.state, "")
            head = f"{r.request_id} [{state}] "
            t.append(f"{r.request_id} ", style)
            t.append(f"[{state}] ", style)
            prompt = r.prompt_preview.replace("\n", " ⏎ ")
            fits = width * prompt_lines - len(head)
            t.append(prompt if len(prompt) <= fits else prompt[:max(0, fits - 1)] + "…",
                     "dim italic")
            t.append("\n")
            text = r.text or output_text(r, tokenizer)
            if text:
                room = max(20, width * (lines - prompt_lines) - 2)
                text = text if len(text) <= room else "…" + text[-room:]
                t.append(text.replace("\n", " ⏎ "), "bold")
            elif r.output_tokens and tokenizer is None:
                t.append(f"{r.output_tokens} tokens ({no_text})", "dim")
            if r.state in ("prefilling", "decoding") and not cut:
                t.append("▌", "blink #4cc97a")
            if r.error:
                t.append(f"\nerror: {r.error}", "#ff5555")
            if extra is not None:
                t.append("\n")
                t.append_text(extra)
            if g_rows:
                t.append("\n")
                t.append_text(grammar_text(grammar, tokenizer, g_rows, width))
            if choice_rows:
                t.append("\n")
                t.append_text(choice_text(r, tokenizer, logprobs_mode, choice_rows, width))
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text

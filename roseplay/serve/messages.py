"""The request models' base (OpenAI's nulls read as defaults) and a chat's messages,
shared by chat completions, /v1/responses and /tokenize (roseplay/serve/protocol.py has
the endpoints' request models)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from engine.front.chat_template import join_parts

# a chat's messages: each renders as at least a few tokens, so more never fits a context;
# the bound keeps a body of empty messages from costing seconds of templating
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 1024           # text parts of one message's content
MAX_TOOL_CALLS = 128               # an assistant message's tool calls


class _Request(msgspec.Struct, kw_only=True):
    """msgspec decodes strictly and ignores unknown fields by default.

    OpenAI's API takes null for its optional fields (`"n": null`, `"stream": null`: what
    clients that send every field write) and means the default, as vLLM does: the
    fields in NULL_DEFAULTS accept null and read it as the default given there."""
    NULL_DEFAULTS: ClassVar[dict[str, object]] = {}

    def __post_init__(self) -> None:
        for name, default in self.NULL_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)


class TextPart(_Request, kw_only=True):
    type: Literal["text"]
    text: str


class ToolCallFunction(_Request, kw_only=True):
    name: str
    arguments: str


class ToolCallIn(_Request, kw_only=True):
    """A tool call an assistant message carries back (a tool round trip)."""
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Request, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Meta(max_length=MAX_CONTENT_PARTS)] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCallIn], Meta(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: str | None = None           # role tool: the call it answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return join_parts(part.text for part in self.content)
        return self.content or ""

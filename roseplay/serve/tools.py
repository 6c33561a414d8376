"""Tool calling on /v1/chat/completions (docs/STRUCTURED_OUTPUTS.md "Tool calling").

`tools` (OpenAI's function definitions) and `tool_choice`:
  none       the model answers in text; no tool call is read from it
  auto       the model chooses: its text is read for Hermes-style calls
             (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what Qwen's and
             Hermes' chat templates teach), the rest is content (vLLM's hermes parser)
  required   a grammar built from the tools' JSON schemas forces at least one call: the
             output is a JSON array [{"name": <a tool>, "parameters": <its schema>}, ...]
             (one item at most with parallel_tool_calls false), vLLM's format
  named      {"type": "function", "function": {"name": ...}}: the output is that tool's
             arguments, constrained by its parameters schema
The answer is OpenAI's `message.tool_calls` (streamed as `delta.tool_calls`: the call's id,
type and name first, then its arguments as they are generated); finish_reason
"tool_calls" when the model called a tool (a named choice keeps "stop", as OpenAI).
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from engine.structured_outputs import StructuredOutputsParams
from roseplay.serve.constrained import decode_small, params
from roseplay.serve.errors import invalid
from roseplay.serve.tool_parsers import CallArrayParser, HermesParser, NamedParser

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ToolDef(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


_TOOLS = msgspec.json.Decoder(Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)])


class Tools:
    """A request's tools and tool_choice, checked (`parse`)."""

    def __init__(self, tools: list[ToolDef], mode: str, named: ToolDef | None,
                 parallel: bool):
        self.tools, self.mode, self.named, self.parallel = tools, mode, named, parallel

    @classmethod
    def parse(cls, tools_raw, choice_raw, parallel: bool) -> "Tools | None":
        """None when the request has no tools (a tool_choice then must be none/auto)."""
        choice = decode_small(choice_raw, "tool_choice")
        tools = _decode_tools(tools_raw)
        if not tools:
            if choice not in (None, "none", "auto"):
                raise invalid(f"tool_choice {str(choice)[:80]!r} needs tools", "tool_choice")
            return None
        if choice is None:
            choice = "auto"
        if choice in ("none", "auto", "required"):
            return cls(tools, choice, None, parallel)
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) \
            and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            else None
        if not isinstance(name, str):
            raise invalid("tool_choice must be none, auto, required or {\"type\": "
                          "\"function\", \"function\": {\"name\": ...}}", "tool_choice")
        named = next((t for t in tools if t.function.name == name), None)
        if named is None:
            raise invalid(f"tool_choice names {name[:64]!r}, which is not in tools",
                          "tool_choice")
        return cls(tools, "named", named, parallel)

    @property
    def field(self) -> str | None:
        """The request field its constraint comes from (a 400's param), if any."""
        return {"required": "tools", "named": "tool_choice"}.get(self.mode)

    def constraint(self) -> StructuredOutputsParams | None:
        if self.mode == "named":
            return params(json=_schema(self.named), param="tool_choice")
        if self.mode != "required":
            return None
        defs: dict = {}
        items = [{"type": "object", "additionalProperties": False,
                  "required": ["name", "parameters"],
                  "properties": {"name": {"const": t.function.name},
                                 "parameters": _hoist_defs(_schema(t), f"t{i}_", defs)}}
                 for i, t in enumerate(self.tools)]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        if defs:
            schema["$defs"] = defs
        return params(json=schema, param="tools")

    def for_template(self, exclude_when_none: bool = False) -> list[dict] | None:
        """The tools as chat templates take them: with tool_choice none too (the model may
        read of them, it only may not call them), as vLLM, unless its
        --exclude-tools-when-tool-choice-none drops them then."""
        if self.mode == "none" and exclude_when_none:
            return None
        return [msgspec.to_builtins(t) for t in self.tools]

    def parser(self):
        """A fresh reader of one choice's output (tool_parsers.py)."""
        if self.mode == "named":
            return NamedParser(self.named.function.name)
        if self.mode == "required":
            return CallArrayParser()
        if self.mode == "auto":
            return HermesParser(self.parallel)
        return None


def _decode_tools(raw) -> list[ToolDef]:
    if decode_small(raw, "tools") is None:
        return []
    try:
        tools = _TOOLS.decode(bytes(raw))
    except msgspec.ValidationError as exc:
        raise invalid(f"tools: {exc}", "tools") from None
    for t in tools:
        if not _NAME.fullmatch(t.function.name):
            raise invalid(f"tools: a function name is 1 to 64 of a-z, A-Z, 0-9, _ and -, "
                          f"got {t.function.name[:80]!r}", "tools")
        if t.function.parameters is not None and not isinstance(t.function.parameters, dict):
            raise invalid("tools: parameters must be a JSON schema object", "tools")
    if len({t.function.name for t in tools}) < len(tools):
        raise invalid("tools: function names must be unique", "tools")
    return tools


def _schema(tool: ToolDef) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _hoist_defs(schema: dict, prefix: str, defs: dict) -> dict:
    """A tool's schema with its $defs moved into the combined schema's root (`defs`),
    renamed with `prefix`, and its "#/$defs/..." references rewritten to match: a
    schema nested under another root resolves "#/..." from that root."""
    own = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    rename = {f"#/{key}/{name}": f"#/$defs/{prefix}{name}"
              for key in ("$defs", "definitions") for name in own}

    def walk(node):
        if isinstance(node, dict):
            return {k: (rename.get(v, v) if k == "$ref" and isinstance(v, str) else walk(v))
                    for k, v in node.items() if k not in ("$defs", "definitions")}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    for name, sub in own.items():
        defs[prefix + name] = walk(sub)
    return walk(schema)


def message_dict(m) -> dict:
    """A request message as chat templates take it: an assistant's tool calls with their
    arguments parsed (templates write them as JSON), a tool result's call id."""
    out = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": _arguments(c.function.arguments)}}
            for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text

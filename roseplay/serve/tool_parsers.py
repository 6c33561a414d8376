"""Reading tool calls out of a choice's text as it is generated (roseplay/serve/tools.py).

Each parser takes the text in pieces (`feed`, then `finish` at the end) and returns
(content text, call deltas): a CallDelta carries a call's index, and on its first delta
its id and name, then pieces of its arguments (JSON text). The same parser serves a
streamed response (a delta per chunk) and a whole one (`read_all`). These read outputs
whose shape a grammar already fixed (named, required) or that the model wrote (auto);
they constrain nothing.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

START, END = "<tool_call>", "</tool_call>"


@dataclass
class CallDelta:
    index: int
    arguments: str = ""
    id: str | None = None            # the first delta of a call: its id and name
    name: str | None = None

    def openai(self) -> dict:
        """OpenAI's delta.tool_calls[] entry."""
        fn = {"arguments": self.arguments}
        out = {"index": self.index, "function": fn}
        if self.id is not None:
            fn["name"] = self.name
            out = {"index": self.index, "id": self.id, "type": "function", "function": fn}
        return out


def _header(index: int, name: str) -> CallDelta:
    return CallDelta(index, "", "call_" + secrets.token_hex(12), name)


def by_call(deltas: list[CallDelta]) -> list[CallDelta]:
    """One delta per call: a stream's `delta.tool_calls` names each index once, as
    OpenAI's does (a call's header and its first arguments read in one piece are one
    entry; a client that reads `tool_calls[0]` would lose the second)."""
    out: list[CallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            last = out[-1]
            out[-1] = CallDelta(d.index, last.arguments + d.arguments, last.id or d.id,
                                last.name or d.name)
        else:
            out.append(d)
    return out


def read_all(parser, text: str) -> tuple[str, list[dict]]:
    """(content, OpenAI tool_calls) of a whole output."""
    content, deltas = parser.feed(text)
    more, tail = parser.finish()
    calls: dict[int, dict] = {}
    for d in deltas + tail:
        call = calls.get(d.index)
        if call is None:
            call = calls[d.index] = {"id": d.id, "type": "function",
                                     "function": {"name": d.name, "arguments": ""}}
        call["function"]["arguments"] += d.arguments
    return content + more, [calls[i] for i in sorted(calls)]


class NamedParser:
    """tool_choice naming a function: the whole output is its arguments."""

    def __init__(self, name: str):
        self.name, self.called = name, False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        deltas = [] if self.called else [_header(0, self.name)]
        self.called = True
        if text:
            deltas.append(CallDelta(0, text))
        return "", deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        return ("", []) if self.called else self.feed("")


class CallArrayParser:
    """tool_choice required: `[{"name": "f", "parameters": {...}}, ...]` (the grammar
    writes name before parameters). Tracks JSON nesting and strings only, to find each
    call's name and the span of its parameters value."""

    def __init__(self):
        self.depth, self.in_str, self.esc = 0, False, False
        self.text: list[str] = []       # the string being read at depth 2 (key or name)
        self.key, self.value_of = None, None
        self.expect_key = False
        self.index = -1
        self.capture: list[str] | None = None   # the parameters value being read
        self.called = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        out: list[CallDelta] = []
        for ch in text:
            self._char(ch, out)
        if self.capture:                          # arguments so far, as one delta
            out.append(CallDelta(self.index, "".join(self.capture)))
            self.capture = []
        return "", out

    def finish(self) -> tuple[str, list[CallDelta]]:
        return "", []

    def _char(self, ch: str, out: list) -> None:
        capturing = self.capture is not None
        if capturing:
            self.capture.append(ch)
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 2 and not capturing:
                    self._string_done("".join(self.text), out)
            elif self.depth == 2:
                self.text.append(ch)
            return
        if ch == '"':
            self.in_str, self.text = True, []
        elif ch in "{[":
            self.depth += 1
            if self.depth == 2:
                self.index, self.expect_key = self.index + 1, True
            elif self.depth == 3 and self.value_of == "parameters" and not capturing:
                self.capture = [ch]
        elif ch in "}]":
            if capturing and self.depth == 3:
                out.append(CallDelta(self.index, "".join(self.capture)))
                self.capture = None
            self.depth -= 1
        elif self.depth == 2 and ch == ":":
            self.expect_key, self.value_of = False, self.key
        elif self.depth == 2 and ch == ",":
            self.expect_key, self.value_of = True, None

    def _string_done(self, s: str, out: list) -> None:
        if self.expect_key:
            self.key = s
        elif self.value_of == "name":
            out.append(_header(self.index, json.loads(f'"{s}"')))
            self.called = True


class HermesParser:
    """tool_choice auto: content, with `<tool_call>{"name", "arguments"}</tool_call>`
    blocks read as calls (a block that is not such JSON stays content)."""

    def __init__(self, parallel: bool = True):
        self.buf, self.inside, self.index, self.parallel = "", False, 0, parallel
        self.called = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self.buf += text
        content, deltas = [], []
        while True:
            if not self.inside:
                at = self.buf.find(START)
                if at < 0:            # keep a tail that may start a tag
                    keep = next((k for k in range(min(len(START) - 1, len(self.buf)), 0, -1)
                                 if START.startswith(self.buf[-k:])), 0)
                    content.append(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                content.append(self.buf[:at])
                self.buf, self.inside = self.buf[at + len(START):], True
            at = self.buf.find(END)
            if at < 0:
                break
            block, self.buf, self.inside = self.buf[:at], self.buf[at + len(END):], False
            first = not self.called
            call = self._call(block)
            if call is None:
                content.append(START + block + END)
            elif self.parallel or first:     # without parallel_tool_calls: the first
                deltas += call               # call only
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        rest = (START if self.inside else "") + self.buf
        self.buf, self.inside = "", False
        return rest, []

    def _call(self, block: str) -> list[CallDelta] | None:
        try:
            obj = json.loads(block)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        head = _header(self.index, obj["name"])
        self.index += 1
        self.called = True
        return [head, CallDelta(head.index, args if isinstance(args, str) else json.dumps(args))]

"""The tool-call readers (roseplay/serve/tool_parsers.py): the same calls and content
whether the text comes whole or a character at a time (a stream's deltas), a Hermes
block that is not a call stays content, a tag cut at a piece's end is held back, and
without parallel_tool_calls only the first call counts; a stream's delta names each
call once (by_call)."""
from __future__ import annotations

import json

import pytest

from roseplay.serve.tool_parsers import (CallArrayParser, HermesParser, NamedParser, by_call,
                                         read_all)


def pieces(parser, text: str, size: int) -> tuple[str, list[dict]]:
    """(content, calls) with the text fed `size` characters at a time."""
    content, deltas = "", []
    for i in range(0, len(text), size):
        c, d = parser.feed(text[i:i + size])
        content, deltas = content + c, deltas + d
    c, d = parser.finish()
    calls: dict[int, dict] = {}
    for x in deltas + d:
        call = calls.setdefault(x.index, {"name": x.name, "arguments": ""})
        assert (x.id is None) == (call["name"] is None or x.name is None)
        call["arguments"] += x.arguments
    return content + c, [calls[i] for i in sorted(calls)]


def plain(calls: list[dict]) -> list[tuple]:
    return [(c["function"]["name"] if "function" in c else c["name"],
             json.loads(c["function"]["arguments"] if "function" in c else c["arguments"]))
            for c in calls]


HERMES = ('Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Verona"}}'
          '</tool_call> and <tool_call>{"name": "summon", "arguments": {"who": "nurse"}}'
          '</tool_call><tool_call>not json</tool_call> <tool_ca')
ARRAY = ('[{"name": "get_weather", "parameters": {"city": "Ve\\"r}ona", "deep": {"a": [1, {}]}}},'
         ' {"name": "summon", "parameters": {"who": "nurse"}}]')


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_hermes_calls_and_content_in_any_pieces(size):
    content, calls = pieces(HermesParser(), HERMES, size)
    assert content == "Let me look.  and <tool_call>not json</tool_call> <tool_ca"
    assert plain(calls) == [("get_weather", {"city": "Verona"}), ("summon", {"who": "nurse"})]
    content, calls = pieces(HermesParser(parallel=False), HERMES, size)
    assert plain(calls) == [("get_weather", {"city": "Verona"})]


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_call_array_in_any_pieces(size):
    parser = CallArrayParser()
    content, calls = pieces(parser, ARRAY, size)
    assert content == "" and parser.called
    assert plain(calls) == [("get_weather", {"city": 'Ve"r}ona', "deep": {"a": [1, {}]}}),
                            ("summon", {"who": "nurse"})]
    _, whole = read_all(CallArrayParser(), ARRAY)
    assert plain(whole) == plain(calls) and all(c["id"].startswith("call_") for c in whole)


def test_a_named_call_is_the_whole_output():
    content, calls = read_all(NamedParser("summon"), '{"who": "friar"}')
    assert content == "" and plain(calls) == [("summon", {"who": "friar"})]


@pytest.mark.parametrize("make,text", [(HermesParser, HERMES), (CallArrayParser, ARRAY),
                                       (lambda: NamedParser("summon"), '{"who": "friar"}')])
def test_a_delta_names_each_call_once(make, text):
    """Read in one piece, a call's header and arguments were two entries of one index in
    a chunk's delta.tool_calls; OpenAI's deltas name an index once."""
    parser = make()
    deltas = by_call(parser.feed(text)[1] + parser.finish()[1])
    assert len({d.index for d in deltas}) == len(deltas) > 0
    assert all(d.id.startswith("call_") and d.name and d.arguments for d in deltas)
    assert [(d.name, json.loads(d.arguments)) for d in deltas] == \
        plain(read_all(make(), text)[1])

"""Structured outputs and tool calls through `roseplay serve` with the official openai
client (docs/STRUCTURED_OUTPUTS.md), on the bundled model in one process: response_format
json_object and json_schema (the client's `parse` with a pydantic model), vLLM's
structured_outputs, tools with tool_choice auto / required / named (whole and streamed:
the deltas add up to the whole answer), a tool round trip, and the 400s: a schema the
engine cannot compile names its field, streamed or not, and a compile past
compile_timeout ends only its own request."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.core.structured.guidance import GuidanceBackend
from engine.front.loop import EngineLoop
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread
from tests.engine.core.structured_schemas import MODELS, Order, check

pytestmark = pytest.mark.timeout(600)
ASK = [{"role": "user", "content": "Who goes there? Answer in JSON."}]
MAX_TOKENS = 120


class Weather(BaseModel):
    """A tool's arguments (bounded, so the bundled model ends them in a few dozen tokens)."""
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


class Summon(BaseModel):
    model_config = ConfigDict(extra="forbid")
    who: Literal["nurse", "friar", "romeo"]


TOOLS = [openai.pydantic_function_tool(Weather, name="get_weather"),
         openai.pydantic_function_tool(Summon, name="summon")]
ARGS = {"get_weather": Weather, "summon": Summon}


@pytest.fixture(scope="module")
def server():
    with EngineLoop(device="cpu") as loop, ServerThread(build_app(loop)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def chat(client, **kw):
    kw = {"model": "default", "messages": ASK, "temperature": 0, "max_tokens": MAX_TOKENS, **kw}
    return client.chat.completions.create(**kw)


def streamed(client, **kw) -> tuple[str, list[dict], str]:
    """A streamed chat's (content, tool calls, finish reason), its deltas put together."""
    content, calls, reason = "", {}, None
    for chunk in chat(client, stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "name": d.function.name,
                                                  "arguments": ""})
                assert d.id is None or d.id == call["id"]
                call["arguments"] += d.function.arguments or ""
            reason = c.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


# -- response_format and structured_outputs ----------------------------------------------
def test_json_object_is_a_json_object(client):
    r = chat(client, response_format={"type": "json_object"}, max_tokens=40)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:                       # cut by length: still an object's opening
        assert text.startswith("{")


@pytest.mark.parametrize("model", MODELS)
def test_parse_with_a_pydantic_model_validates(client, model):
    r = client.chat.completions.parse(model="default", messages=ASK, temperature=0,
                                      max_tokens=MAX_TOKENS, response_format=model)
    c = r.choices[0]
    assert c.finish_reason == "stop" and isinstance(c.message.parsed, model)
    check(model, c.message.content)


def test_completions_take_a_json_schema_and_vllm_fields(client):
    schema = Order.model_json_schema()
    r = client.completions.create(model="default", prompt="ROMEO.\n", temperature=0,
                                  max_tokens=MAX_TOKENS, extra_body={"response_format": {
                                      "type": "json_schema",
                                      "json_schema": {"name": "order", "schema": schema}}})
    check(Order, r.choices[0].text)
    r = client.completions.create(model="default", prompt="ROMEO.\n", max_tokens=10, n=3,
                                  temperature=1.0, seed=5, extra_body={
                                      "structured_outputs": {"choice": ["aye", "nay"]}})
    assert {c.text for c in r.choices} <= {"aye", "nay"}
    r = client.completions.create(model="default", prompt="ROMEO.\n", max_tokens=12,
                                  temperature=0,
                                  extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert r.choices[0].text.isdigit() and len(r.choices[0].text) == 3


@pytest.mark.parametrize("disable_fallback", [True, False])
def test_vllm_disable_fallback_is_taken(client, disable_fallback):
    """vLLM's structured_outputs.disable_fallback (no other backend on an error): the
    engine has no fallback per request, so either value is honoured; it was a 400
    (unknown field)."""
    r = client.completions.create(model="default", prompt="ROMEO.\n", max_tokens=12,
                                  temperature=0, extra_body={"structured_outputs": {
                                      "regex": "[0-9]{3}", "disable_fallback": disable_fallback}})
    assert r.choices[0].text.isdigit() and len(r.choices[0].text) == 3
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="ROMEO.\n", max_tokens=2,
                                  extra_body={"structured_outputs": {
                                      "regex": "[0-9]", "disable_fallback": "yes"}})
    assert e.value.body["param"] == "structured_outputs"


def test_a_streamed_schema_adds_up_to_the_whole_answer(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "strict": True,
                                                  "schema": Order.model_json_schema()}}
    whole = chat(client, response_format=fmt).choices[0].message.content
    content, calls, reason = streamed(client, response_format=fmt)
    assert content == whole and not calls and reason == "stop"
    check(Order, content)


# -- tools -------------------------------------------------------------------------------
def check_calls(calls, names=tuple(ARGS)):
    for c in calls:
        assert c["name"] in names
        ARGS[c["name"]].model_validate_json(c["arguments"])


def as_dicts(message) -> list[dict]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls or []]


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_choice_required_calls_tools(client, parallel):
    """One call at most without parallel_tool_calls; with it, the bundled model goes on
    calling until max_tokens (greedy repeats itself): every call it finished validates."""
    r = chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    c = r.choices[0]
    calls = as_dicts(c.message)
    assert c.message.content is None and len({x["id"] for x in calls}) == len(calls)
    if parallel:
        assert c.finish_reason == "length" and len(calls) > 2
        check_calls([x for x in calls if _complete(x["arguments"])])
    else:
        assert c.finish_reason == "tool_calls" and len(calls) == 1
        check_calls(calls)
    content, streamed_calls, reason = streamed(client, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=parallel)
    assert reason == c.finish_reason and not content
    assert [(x["name"], x["arguments"]) for x in streamed_calls] == \
        [(x["name"], x["arguments"]) for x in calls]


def _complete(arguments: str) -> bool:
    try:
        json.loads(arguments)
        return True
    except ValueError:
        return False


def test_a_named_tool_choice_calls_that_tool(client):
    named = {"type": "function", "function": {"name": "summon"}}
    c = chat(client, tools=TOOLS, tool_choice=named).choices[0]
    calls = as_dicts(c.message)
    assert c.finish_reason == "stop" and [x["name"] for x in calls] == ["summon"]
    check_calls(calls)
    content, streamed_calls, reason = streamed(client, tools=TOOLS, tool_choice=named)
    assert (content, reason) == ("", "stop")
    assert [(x["name"], x["arguments"]) for x in streamed_calls] == \
        [(x["name"], x["arguments"]) for x in calls]


def test_tool_choice_auto_and_none_leave_the_model_free(client):
    """The bundled model writes no <tool_call>: its answer is content, as without tools."""
    free = chat(client, max_tokens=16).choices[0]
    for choice in ("auto", "none"):
        c = chat(client, tools=TOOLS, tool_choice=choice, max_tokens=16).choices[0]
        assert c.message.content == free.message.content and not c.message.tool_calls
        assert c.finish_reason == free.finish_reason


def test_a_tool_round_trip(client):
    """parse() with strict function tools reads the call's arguments; the call and the
    tool's answer go back in the conversation, and the model answers in text."""
    r = client.chat.completions.parse(model="default", messages=ASK, temperature=0,
                                      max_tokens=MAX_TOKENS, tools=TOOLS,
                                      tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, ARGS[call.function.name])
    messages = ASK + [r.choices[0].message.model_dump(exclude_none=True,
                                                      exclude={"parsed"}),
                      {"role": "tool", "tool_call_id": call.id, "content": "Fair, 18 C."}]
    for m in messages:
        for c in m.get("tool_calls", []):
            c["function"].pop("parsed_arguments", None)
    answer = client.chat.completions.create(model="default", messages=messages,
                                            tools=TOOLS, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


# -- refusals ----------------------------------------------------------------------------
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x",
                                                     "schema": {"type": "no-such-type"}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_that_does_not_compile_is_a_400(client, stream):
    with pytest.raises(openai.BadRequestError) as err:
        r = chat(client, response_format=BAD_SCHEMA, stream=stream)
        list(r) if stream else r
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "invalid_request_error"
    assert body["message"].startswith("structured output grammar")
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "no-such-type"}}}], tool_choice="required")
    assert err.value.status_code == 400


def test_a_schema_that_does_not_compile_names_its_field(client):
    """A grammar refused at submit (engine/grammars.py) names the request field it came
    from, as a compile failure did (it was a 400 with param null)."""
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, response_format=BAD_SCHEMA)
    assert err.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "no-such-type"}}}], tool_choice="required")
    assert err.value.body["param"] == "tools"


INVALID = {    # kind -> (the request's fields, what the 400's message names)
    "regex": ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex is invalid"),
    "json schema": ({"guided_json": {"type": "no-such-type"}},
                    "structured_outputs.json is invalid"),
    "lark grammar": ({"structured_outputs": {"grammar": "start: undefined_rule"}},
                     "structured_outputs.grammar is invalid"),
    "ebnf grammar": ({"guided_grammar": 'root ::= "a" undefined_rule'},
                     "structured_outputs.grammar is invalid"),
    "empty choice": ({"structured_outputs": {"choice": []}},
                     "structured_outputs.choice must be 1 to"),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", list(INVALID))
def test_an_invalid_constraint_is_a_400_and_the_server_serves_on(server, kind, stream):
    """Refused before the engine sees it, streamed or not; the next request is answered."""
    fields, message = INVALID[kind]
    url = server.url + "/v1/completions"
    body = {"model": "default", "prompt": "ROMEO:", "max_tokens": 4, "temperature": 0,
            "stream": stream}
    r = httpx.post(url, json={**body, **fields}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"], err
    ok = httpx.post(url, json={**body, "stream": False}, timeout=120)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_a_compile_past_compile_timeout_is_a_400_and_the_neighbours_run(monkeypatch):
    """A compile held past compile_timeout (an event stands for a slow one, open only at
    the end): its request gets a 400 that says so, and a free request beside it is
    answered while the compile thread still hangs."""
    gate = threading.Event()
    compile_ = GuidanceBackend.compile
    monkeypatch.setattr(GuidanceBackend, "compile",
                        lambda self, p: gate.wait(60) and compile_(self, p))
    body = {"model": "dummy:tiny", "prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0}
    slow = {**body, "structured_outputs": {"choice": ["yes"]}}
    try:
        with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64,
                        structured_outputs_config={"compile_timeout": 0.5}) as loop, \
                ServerThread(build_app(loop)) as srv, ThreadPoolExecutor(2) as pool:
            url = srv.url + "/v1/completions"
            refused = pool.submit(httpx.post, url, json=slow, timeout=120)
            free = pool.submit(httpx.post, url, json=body, timeout=120)
            r, ok = refused.result(), free.result()
    finally:
        gate.set()
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 6
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "structured_outputs" and "compile_timeout" in err["message"]

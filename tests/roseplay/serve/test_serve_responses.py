"""POST /v1/responses (OpenAI's Responses API) with the official openai client on the
bundled model (CPU, 127.0.0.1): the same greedy text and usage as the chat it runs as,
OpenAI's stream events in order, incomplete by max_output_tokens, instructions as a
system message, refused fields as 400s naming the param, nothing stored (404), and a
client that leaves mid-stream cancels its engine request."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.front.loop import EngineLoop
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread
from tests import helpers

pytestmark = pytest.mark.timeout(120)
ASK = "What news from the court?"
STOP = {"stop": ["\n\n"]}        # vLLM's extra: ends Juliet's turn (status completed)


@pytest.fixture(scope="module")
def loop():
    with EngineLoop(device="cpu") as loop:
        yield loop


@pytest.fixture(scope="module")
def server(loop):
    with ServerThread(build_app(loop)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0) as c:
        yield c


def chat(client, messages, max_tokens, **extra):
    r = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                       temperature=0, extra_body=extra or None)
    return r.choices[0], r.usage


def check_usage(resp_usage, chat_usage):
    assert (resp_usage.input_tokens, resp_usage.output_tokens, resp_usage.total_tokens) == \
        (chat_usage.prompt_tokens, chat_usage.completion_tokens, chat_usage.total_tokens)


@pytest.mark.parametrize("max_tokens,extra,status", [(12, {}, "incomplete"),
                                                     (60, STOP, "completed")])
def test_a_response_is_the_greedy_chat(client, max_tokens, extra, status):
    want, want_usage = chat(client, [{"role": "user", "content": ASK}], max_tokens, **extra)
    r = client.responses.create(model="default", input=ASK, max_output_tokens=max_tokens,
                                temperature=0, extra_body=extra or None)
    assert r.output_text == want.message.content and r.output_text
    check_usage(r.usage, want_usage)
    assert r.status == status and want.finish_reason == {"incomplete": "length",
                                                         "completed": "stop"}[status]
    assert r.incomplete_details == (None if status == "completed" else
                                    type(r.incomplete_details)(reason="max_output_tokens"))
    assert (r.object, r.model, r.id[:5], r.max_output_tokens, r.temperature) == \
        ("response", "default", "resp_", max_tokens, 0)
    (item,) = r.output
    assert (item.type, item.role, item.status, item.id[:4]) == ("message", "assistant", status,
                                                                "msg_")
    assert [p.type for p in item.content] == ["output_text"]


@pytest.mark.parametrize("max_tokens,extra,end", [(12, {}, "response.incomplete"),
                                                  (60, STOP, "response.completed")])
def test_a_stream_sends_openais_events_in_order(client, max_tokens, extra, end):
    want, want_usage = chat(client, [{"role": "user", "content": ASK}], max_tokens, **extra)
    events = list(client.responses.create(model="default", input=ASK, max_output_tokens=max_tokens,
                                          temperature=0, stream=True, extra_body=extra or None))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + [d.type for d in deltas] + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        end]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    final = events[-1].response
    assert text == events[-4].text == events[-2].item.content[0].text == final.output_text \
        == want.message.content
    assert {e.response.id for e in events[:2]} == {final.id}
    assert events[0].response.status == "in_progress" and final.status == end.split(".")[1]
    assert {d.item_id for d in deltas} == {final.output[0].id}
    check_usage(final.usage, want_usage)


def test_the_stream_helper_reads_the_final_response(client):
    """openai's `responses.stream()` helper accumulates the events into the response."""
    with client.responses.stream(model="default", input=ASK, max_output_tokens=40, temperature=0,
                                 extra_body=STOP) as stream:
        final = stream.get_final_response()
    want, _ = chat(client, [{"role": "user", "content": ASK}], 40, **STOP)
    assert final.status == "completed" and final.output_text == want.message.content


def test_instructions_are_a_system_message_and_items_are_turns(client):
    instructions = "A room in the castle. Enter ROMEO and JULIET."
    turns = [{"role": "user", "content": "Good\nmorrow."},
             {"role": "assistant", "content": "Good morrow, sweet Romeo."},
             {"role": "user", "content": ASK}]
    want, want_usage = chat(client, [{"role": "system", "content": instructions}, *turns], 40,
                            **STOP)
    items = [{"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "Good"}, {"type": "input_text",
                                                                   "text": "morrow."}]},
             # an assistant message handed back as the output item it was
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Good morrow, sweet Romeo.",
                           "annotations": []}]},
             {"role": "user", "content": ASK}]
    r = client.responses.create(model="default", instructions=instructions, input=items,
                                max_output_tokens=40, temperature=0, extra_body=STOP)
    assert r.output_text == want.message.content and r.instructions == instructions
    check_usage(r.usage, want_usage)
    as_input = client.responses.create(model="default", max_output_tokens=40, temperature=0,
                                       extra_body=STOP, input=[
                                           {"role": "developer", "content": instructions},
                                           *turns])
    assert as_input.output_text == r.output_text


def test_output_logprobs_when_included(client):
    ask = dict(model="default", input=ASK, max_output_tokens=6, temperature=0,
               include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**ask)
    lps = r.output[0].content[0].logprobs
    assert "".join(lp.token for lp in lps) == r.output_text and len(lps) == r.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob == lp.logprob
               for lp in lps)
    events = list(client.responses.create(**ask, stream=True))
    streamed = [(lp.token, lp.logprob) for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert streamed == [(lp.token, lp.logprob) for lp in lps]
    assert [lp.token for lp in events[-1].response.output[0].content[0].logprobs] == \
        [lp.token for lp in lps]


def test_streamed_logprobs_of_a_stop_string_are_the_final_ones(client):
    """The stop string's tokens have logprobs (the final object's, as vLLM's) but no text
    to send: the stream still gives them, in an empty delta before output_text.done."""
    ask = dict(model="default", input=ASK, max_output_tokens=60, temperature=0,
               include=["message.output_text.logprobs"], extra_body=STOP)
    final = client.responses.create(**ask).output[0].content[0].logprobs
    assert "".join(lp.token for lp in final).endswith("\n\n")
    events = list(client.responses.create(**ask, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [(lp.token, lp.logprob) for e in deltas for lp in e.logprobs] == \
        [(lp.token, lp.logprob) for lp in final]
    assert "".join(e.delta for e in deltas) == events[-1].response.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in final]


def test_text_format_json_schema_constrains_the_output(client):
    schema = {"type": "object", "properties": {"who": {"enum": ["nurse", "friar"]}},
              "required": ["who"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "who", "schema": schema, "strict": True}}
    r = client.responses.create(model="default", input="Who comes?", max_output_tokens=40,
                                temperature=0, text=fmt)
    assert json.loads(r.output_text)["who"] in ("nurse", "friar")
    assert r.text.format.type == "json_schema"


REFUSED = [  # (body changes, param, words of the message)
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools", "tools"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "not stored"),
    ({"conversation": "conv_1"}, "conversation", "not stored"),
    ({"store": True}, "store", "not stored"),
    ({"cache_salt": "tenant-a"}, "cache_salt", "prefix cache"),
    ({"background": True}, "background", "store"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt templates"),
    ({"truncation": "auto"}, "truncation", "truncation"),
    ({"service_tier": "flex"}, "service_tier", "one tier"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "reasoning.encrypted_content"),
    ({"top_logprobs": 2}, "top_logprobs", "include"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "needs a schema"),
    ({"text": {"format": {"type": "grammar"}}}, "text", "type must be"),
    ({"text": {"verbosity": "low"}}, "text", "verbosity"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input", "input[0].content[0]: 'input_image' parts are not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input",
     "input[0]: items of type 'function_call_output'"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input", "input[0].role must be"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input",
     "input[0].content[0]: the input_text part has no text"),
    ({"input": []}, "input", ""),
    ({"input": 5}, "input", ""),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be"),
    ({"max_output_tokens": 5000}, "max_output_tokens", "maximum context length"),
    ({"input": "ROMEO. " * 900}, "input", "maximum context length"),
    ({"temperature": -1}, "temperature", "temperature must be"),
    ({"model": "nope"}, "model", "does not exist"),
]


@pytest.mark.parametrize("change,param,words", REFUSED, ids=[r[1] for r in REFUSED])
def test_what_cannot_be_honoured_is_a_400_naming_the_param(server, change, param, words):
    r = httpx.post(server.url + "/v1/responses", timeout=30,
                   json={"model": "default", "input": "Hi", "max_output_tokens": 4, **change})
    assert r.status_code == (404 if param == "model" else 400), r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_null_and_defaults_pass(client):
    """What clients send for "nothing asked" is no refusal: store false, empty tools,
    tool_choice auto, reasoning {} (and openai's own nulls)."""
    r = client.responses.create(model="default", input="Hi", max_output_tokens=2, temperature=0,
                                store=False, tools=[], tool_choice="auto", reasoning={},
                                truncation="disabled", metadata={"class": "4b"},
                                extra_body={"previous_response_id": None, "stream": None})
    assert r.status == "incomplete" and r.metadata == {"class": "4b"} and r.tools == []


def test_responses_are_not_stored(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_abc")
    assert e.value.body["param"] == "response_id" and "does not store" in e.value.body["message"]
    for method, path in (("DELETE", "/v1/responses/resp_abc"),
                         ("POST", "/v1/responses/resp_abc/cancel"),
                         ("GET", "/v1/responses/resp_abc/input_items")):
        assert httpx.request(method, server.url + path).status_code == 404
    assert "/v1/responses" in httpx.get(server.url + "/openapi.json").json()["paths"]


def test_a_client_leaving_mid_stream_cancels_the_request(server, loop):
    body = {"model": "default", "input": ASK, "max_output_tokens": 800, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        lines = r.iter_lines()
        delta = next(line for line in lines if line.startswith("data: ")
                     and '"response.output_text.delta"' in line)
        rid = "resp-" + json.loads(delta[6:])["item_id"][4:] + "-0"     # the engine's id
        helpers.wait_for(lambda: getattr(loop.snapshot().request(rid), "state", None)
                         == "decoding", 20)
    helpers.wait_for(lambda: loop.snapshot().request(rid).state == "cancelled", 20)
    helpers.wait_for(lambda: loop.snapshot().num_used == 0, 20)
    assert loop.snapshot().request(rid).output_tokens < 800
    assert server.app.state.serve.bridge.pending == 0


def test_a_stream_cut_by_the_server_ends_with_error_and_response_failed(server, client):
    """A shutdown's cut (as an engine failure) ends the stream with OpenAI's `error`
    event and response.failed, and the server serves on."""
    with client.responses.create(model="default", input=ASK, max_output_tokens=800,
                                 stream=True, extra_body={"ignore_eos": True}) as stream:
        events = []
        for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta" and len(events) == 5:
                assert server.app.state.serve.drain.cut("cut by the test") == 1
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == "cut by the test" and events[-2].code == "server_error"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message == "cut by the test"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert client.responses.create(model="default", input="Hi", max_output_tokens=2).status \
        == "incomplete"

"""What clients of OpenAI's and vLLM's servers rely on, on the default path (the engine
in its own process, the bundled model, 127.0.0.1): a stream never sends text that a stop
string later cuts (streamed text = non-streamed text), explicit nulls in optional fields
mean their defaults, and the model retrieve and /version routes answer."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.front.loop import EngineLoop
from roseplay import __version__
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"


def streamed(http, path: str, body: dict) -> tuple[dict, dict]:
    """Texts and finish reasons per choice of a streamed request."""
    texts, reasons = {}, {}
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                part = c["text"] if "text" in c else (c["delta"].get("content") or "")
                texts[c["index"]] = texts.get(c["index"], "") + part
                if c["finish_reason"]:
                    reasons[c["index"]] = c["finish_reason"]
    return texts, reasons


def stop_across_tokens(http) -> tuple[str, str]:
    """A stop string made of the last character of one greedy token and the first of the
    next (it matches only when the second arrives), and the text before it."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 32, "temperature": 0,
            "logprobs": 0}
    lps = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    text = "".join(lps["tokens"])
    for prev, tok, at in zip(lps["tokens"], lps["tokens"][1:], lps["text_offset"][1:]):
        stop = prev[-1:] + tok[:1]
        if len(stop) == 2 and text.find(stop) == at - 1:
            return stop, text[:at - 1]
    pytest.skip("no token boundary makes a stop string here")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_holds_back_the_start_of_a_stop_string(http, path):
    stop, want = stop_across_tokens(http)
    body = {"model": "default", "max_tokens": 32, "temperature": 0, "stop": [stop]}
    if path == "/v1/completions":
        body["prompt"] = PROMPT
    else:       # the play template renders this chat as PROMPT (roseplay/serve/chat.py)
        body["messages"] = [{"role": "user", "content": "What news from the court?"}]
    whole = http.post(path, json=body).json()["choices"][0]
    text = whole["text"] if "text" in whole else whole["message"]["content"]
    if path == "/v1/completions":
        assert text == want
    assert whole["finish_reason"] == "stop"
    assert streamed(http, path, body) == ({0: text}, {0: "stop"})


@pytest.mark.parametrize("path,body,fields", [
    ("/v1/completions", {"prompt": PROMPT},
     ("n", "stream", "echo", "return_token_ids", "stream_options")),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]},
     ("n", "stream", "logprobs", "parallel_tool_calls", "return_token_ids"))])
def test_null_means_the_default(http, path, body, fields):
    """OpenAI's API takes null in its optional fields (clients that send every field
    write `"n": null`); it was a 400 ("Expected `int`, got `null`")."""
    base = {"model": "default", "max_tokens": 2, "temperature": 0, **body}
    want = http.post(path, json=base).json()
    got = http.post(path, json={**base, **dict.fromkeys(fields)})
    assert got.status_code == 200, got.text
    assert [c.get("text", c.get("message")) for c in got.json()["choices"]] == \
        [c.get("text", c.get("message")) for c in want["choices"]]
    assert "token_ids" not in got.json()["choices"][0]
    usage_null = {**base, "stream": True, "stream_options": {"include_usage": None}}
    with http.stream("POST", path, json=usage_null) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert r.status_code == 200 and json.loads(lines[-1][6:])["usage"] is None


def test_chat_echo_repeats_the_assistant_message_first(http):
    """vLLM's chat `echo`: each choice's content starts with the last message's text when
    that message is the assistant's (streamed: in the choice's first chunk); it was
    ignored as an unknown field."""
    turns = [{"role": "user", "content": "What news?"}, {"role": "assistant", "content": "Sir,"}]
    body = {"model": "default", "messages": turns, "max_tokens": 4, "temperature": 0, "n": 2,
            "add_generation_prompt": False}
    plain = [c["message"]["content"] for c in http.post("/v1/chat/completions", json=body)
             .json()["choices"]]
    echoed = [c["message"]["content"] for c in http.post(
        "/v1/chat/completions", json={**body, "echo": True}).json()["choices"]]
    assert echoed == ["Sir," + text for text in plain]
    texts, _ = streamed(http, "/v1/chat/completions", {**body, "echo": True})
    assert texts == {0: echoed[0], 1: echoed[1]}
    user_last = {**body, "messages": turns[:1], "add_generation_prompt": True}
    assert http.post("/v1/chat/completions", json={**user_last, "echo": True}).json() \
        ["choices"][0]["message"]["content"] == http.post(
        "/v1/chat/completions", json=user_last).json()["choices"][0]["message"]["content"]


def test_models_retrieve_and_version(server, http):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    card = client.models.retrieve("default")
    assert (card.id, card.object, card.owned_by) == ("default", "model", "roseplay")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert http.get("/version").json() == {"version": __version__}
    for path in ("/v1/models/", "/v1/models/default/"):     # no redirect, no model named ""
        r = http.get(path)
        assert r.status_code == 404 and "without the trailing slash" in r.json()["error"]["message"]


def test_a_streamed_tool_call_names_its_index_once_per_chunk(http):
    """The first chunk of a named tool call carried [{index 0, id, name, ""}, {index 0,
    "{"}]; OpenAI's deltas name an index once (clients read tool_calls[0])."""
    tool = {"type": "function", "function": {"name": "summon", "parameters": {
        "type": "object", "properties": {"who": {"enum": ["nurse", "friar"]}},
        "required": ["who"], "additionalProperties": False}}}
    body = {"model": "default", "messages": [{"role": "user", "content": "Who?"}],
            "max_tokens": 40, "temperature": 0, "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "summon"}}}
    whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    arguments, names = "", []
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    calls = c["delta"].get("tool_calls") or []
                    assert len({d["index"] for d in calls}) == len(calls), calls
                    names += [d["function"]["name"] for d in calls if "id" in d]
                    arguments += "".join(d["function"]["arguments"] for d in calls)
    assert names == ["summon"]
    assert arguments == whole["message"]["tool_calls"][0]["function"]["arguments"]


def test_stop_strings_without_a_tokenizer_name_stop():
    """A dummy model has no tokenizer, so stop strings can never match: the 400 named
    `model` (the engine's message begins with it), not the field to change."""
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=32) as loop, \
            ServerThread(build_app(loop)) as srv, httpx.Client(base_url=srv.url) as http:
        body = {"model": "dummy:tiny", "prompt": [1, 2, 3], "max_tokens": 2}
        r = http.post("/v1/completions", json={**body, "stop": ["x"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
        assert http.post("/v1/completions", json={**body, "stop_token_ids": [5]}).status_code == 200


def test_vllm_guided_fields_constrain_the_output(http):
    """vLLM's guided_json / guided_regex / guided_choice / guided_grammar (its fields
    before structured_outputs, still in clients' code) were ignored as unknown fields:
    the output came unconstrained, with a 200."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    out = {}
    for field, value in [("guided_choice", ["aye", "nay"]), ("guided_regex", "[0-9]{3}"),
                         ("guided_grammar", 'root ::= "yes" | "no"'),
                         ("guided_json", {"type": "object", "properties": {
                             "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "required": ["n"],
                             "additionalProperties": False})]:
        r = http.post("/v1/completions", json={**body, field: value})
        assert r.status_code == 200, r.text
        out[field] = r.json()["choices"][0]["text"]
    assert out["guided_choice"] in ("aye", "nay") and out["guided_grammar"] in ("yes", "no")
    assert out["guided_regex"].isdigit() and len(out["guided_regex"]) == 3
    assert set(json.loads(out["guided_json"])) == {"n"}
    chat = {"model": "default", "messages": [{"role": "user", "content": "Aye?"}],
            "max_tokens": 4, "guided_choice": ["aye", "nay"]}
    assert http.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"][
        "content"] in ("aye", "nay")
    for extra, param in [({"guided_regex": "("}, "guided_regex"),
                         ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_regex"),
                         ({"guided_regex": "b", "structured_outputs": {"regex": "c"}},
                          "guided_regex")]:
        r = http.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_echo_with_max_tokens_0_scores_the_prompt(http):
    """OpenAI's legacy scoring call (and vLLM's): echo with max_tokens 0 returns the
    prompt's text and logprobs alone; it was a 400 (max_tokens must be >= 1)."""
    body = {"model": "default", "prompt": PROMPT, "echo": True, "logprobs": 1,
            "temperature": 0}
    one = http.post("/v1/completions", json={**body, "max_tokens": 1}).json()
    r = http.post("/v1/completions", json={**body, "max_tokens": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice, n_prompt = r.json()["choices"][0], r.json()["usage"]["prompt_tokens"]
    assert choice["text"] == PROMPT and choice["token_ids"] == []
    assert r.json()["usage"]["completion_tokens"] == 0
    lps = choice["logprobs"]
    assert "".join(lps["tokens"]) == PROMPT and len(lps["tokens"]) == n_prompt
    assert lps == {k: v[:n_prompt] for k, v in one["choices"][0]["logprobs"].items()}
    texts, _ = streamed(http, "/v1/completions", {**body, "max_tokens": 0, "n": 2})
    assert texts == {0: PROMPT, 1: PROMPT}
    r = http.post("/v1/completions", json={**body, "echo": False, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_puts_usage_in_every_chunk(http, path):
    """vLLM's stream_options.continuous_usage_stats was ignored: every chunk said
    usage null. Each chunk now carries its choice's usage so far."""
    body = {"model": "default", "max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 3,
            "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if path == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": "What news?"}]
    seen, final = {}, None
    with http.stream("POST", path, json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if not chunk["choices"]:
                final = chunk["usage"]
                continue
            (choice,), u = chunk["choices"], chunk["usage"]
            assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
            assert u["completion_tokens"] >= seen.get(choice["index"], 0)
            seen[choice["index"]] = u["completion_tokens"]
    assert seen == {0: 6, 1: 6} and final["completion_tokens"] == 12
    assert final["prompt_tokens"] == u["prompt_tokens"]


def test_truncate_prompt_tokens_keeps_the_prompts_end(http):
    """vLLM's truncate_prompt_tokens was ignored: a prompt longer than the context was a
    400 instead of its last k tokens, and a shorter one ran whole."""
    ids = list(range(1, 2001))                    # past the bundled model's 1024
    body = {"model": "default", "max_tokens": 2, "temperature": 0, "echo": True,
            "truncate_prompt_tokens": 10}
    r = http.post("/v1/completions", json={**body, "prompt": ids})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 10
    tail = http.post("/v1/completions", json={**body, "prompt": ids[-10:],
                                             "truncate_prompt_tokens": None}).json()
    assert r.json()["choices"][0]["text"] == tail["choices"][0]["text"]
    r = http.post("/v1/completions", json={**body, "prompt": "Hark! " * 600})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 10, r.text
    chat = {"model": "default", "max_tokens": 2, "truncate_prompt_tokens": 5,
            "messages": [{"role": "user", "content": "What news from the court?"}]}
    assert http.post("/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens"] == 5
    for bad in (0, -2, 5000):
        r = http.post("/v1/completions", json={**body, "prompt": ids,
                                               "truncate_prompt_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_cors_only_for_the_origins_allowed():
    """A browser page's preflight and its call get CORS headers for an allowed origin
    (vLLM's --allowed-origins), before the key check; none by default."""
    from fastapi.testclient import TestClient

    from roseplay.serve.app import ServeConfig
    page = {"Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"}
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=32) as loop:
        config = ServeConfig(api_key="sk-1", allowed_origins=["http://ui.example"])
        with TestClient(build_app(loop, config)) as c:
            pre = c.options("/v1/completions", headers=page)
            assert pre.status_code == 200 and \
                pre.headers["access-control-allow-origin"] == "http://ui.example"
            r = c.get("/v1/models", headers={"Origin": "http://ui.example",
                                             "Authorization": "Bearer sk-1"})
            assert r.status_code == 200 and \
                r.headers["access-control-allow-origin"] == "http://ui.example"
            other = c.options("/v1/completions", headers={**page, "Origin": "http://evil.example"})
            assert "access-control-allow-origin" not in other.headers
        with TestClient(build_app(loop, ServeConfig())) as c:      # the default: no CORS
            r = c.options("/v1/completions", headers=page)
            assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    with pytest.raises(ValueError, match="allowed_origins must be a list of strings"):
        ServeConfig(allowed_origins="*")


def test_tokenize_and_detokenize_as_the_engine_sees_the_prompt(http):
    """vLLM's /tokenize and /detokenize: a prompt's ids are those /v1/completions feeds
    the engine (its usage counts them), a chat's those of its template; ids come back
    to the text; bad input is a 400 naming its field."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    used = http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens"]
    r = http.post("/tokenize", json={"model": "default", "prompt": PROMPT,
                                     "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == used == len(r["token_strs"])
    assert r["max_model_len"] > used and "".join(r["token_strs"]).startswith("RO")
    back = http.post("/detokenize", json={"model": "default", "tokens": r["tokens"]}).json()
    assert back == {"prompt": PROMPT}
    chat = {"model": "default", "messages": [{"role": "user", "content": "Speak."}]}
    used = http.post("/v1/chat/completions", json={**chat, "max_tokens": 1}).json()
    t = http.post("/tokenize", json=chat).json()
    assert t["count"] == used["usage"]["prompt_tokens"] and t["token_strs"] is None
    for path, bad, param in (("/tokenize", {"prompt": "a", "messages": chat["messages"]}, "prompt"),
                             ("/tokenize", {"model": "nope", "prompt": "a"}, "model"),
                             ("/detokenize", {"tokens": [-1]}, "tokens"),
                             ("/detokenize", {"tokens": "abc"}, "tokens")):
        r = http.post(path, json=bad)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_stop_reason_in_choices_and_the_last_chunk(http):
    """vLLM's stop_reason: the stop string that ended a choice, streamed (on the chunk
    that ends it) or not; null for a length cap."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    free = http.post("/v1/completions", json=body).json()["choices"][0]
    assert free["finish_reason"] == "length" and free["stop_reason"] is None
    stop = free["text"].split()[2]
    got = http.post("/v1/completions", json={**body, "stop": ["zzz", stop]}).json()["choices"][0]
    assert got["finish_reason"] == "stop" and got["stop_reason"] == stop
    last = None
    with http.stream("POST", "/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "Speak."}],
            "max_tokens": 24, "temperature": 0, "stream": True, "stop": [" "]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"]
                last = c[0] if c else last
    assert last["finish_reason"] == "stop" and last["stop_reason"] == " "


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses"])
def test_include_stop_str_in_output_keeps_the_stop_string(http, path):
    """vLLM's include_stop_str_in_output (refused until the front honoured it): the text
    runs up to and with the stop string, streamed or not; the finish is still a stop."""
    free = http.post("/v1/completions", json={"model": "default", "prompt": PROMPT,
                                              "max_tokens": 24, "temperature": 0}).json()
    stop = free["choices"][0]["text"].split()[2]
    body = {"model": "default", "temperature": 0, "stop": [stop]}
    if path == "/v1/responses":
        body |= {"input": "What news from the court?", "max_output_tokens": 24}
    elif path == "/v1/completions":
        body |= {"prompt": PROMPT, "max_tokens": 24}
    else:
        body |= {"messages": [{"role": "user", "content": "What news from the court?"}],
                 "max_tokens": 24}

    def text(json_body):
        r = http.post(path, json=json_body)
        assert r.status_code == 200, r.text
        out = r.json()
        if path == "/v1/responses":
            return out["output"][0]["content"][0]["text"]
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop"
        return choice.get("text", (choice.get("message") or {}).get("content"))

    cut, kept = text(body), text({**body, "include_stop_str_in_output": True})
    assert stop not in cut
    assert kept.startswith(cut) and kept.endswith(stop) and len(kept) > len(cut)
    if path != "/v1/responses":
        assert streamed(http, path, {**body, "include_stop_str_in_output": True})[0] == {0: kept}


"""What a demanding OpenAI client expects of `roseplay serve`, on the default path (the
engine in its own process, EngineClient): every 400 names its field in `param`; types
are strict (`true` is no integer, `"5"` no number); the Bearer scheme is
case-insensitive; slow clients are cut after the request-read timeout and idle
connections after the keep-alive one; tool_choice without tools is refused, and so is
a grammar the engine cannot compile (param: the field it came from); a body over
the limit gets 413 before it is read (a long prompt tokenized off the event loop: in
tests/roseplay/serve/test_serve_adversarial.py, which has the server in a process of its own)."""
from __future__ import annotations

import json
import logging
import math
import time

import httpx
import openai
import pytest

from engine.front.client import EngineClient
from engine.validation import MIN_REPETITION_PENALTY, MIN_TOP_P
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread
from tests.roseplay.serve.raw_sockets import closed_after, connect

pytestmark = pytest.mark.timeout(120)
KEY = "sk-conformance"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_TIMEOUT, KEEP_ALIVE = 1.5, 1.0
MAX_BODY = 4 * 1024 * 1024
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
GOOD = {"model": "default", "prompt": PROMPT, "max_tokens": 4}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "What news?"}],
        "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    config = ServeConfig(api_key=KEY, timeout_request_read=READ_TIMEOUT,
                         timeout_keep_alive=KEEP_ALIVE, max_body_bytes=MAX_BODY)
    with EngineClient(label="server", snapshots=False) as engine, \
            ServerThread(build_app(engine, config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


PARAMS = [  # (endpoint, body, the param the 400 must name)
    ("completions", {**GOOD, "max_tokens": True}, "max_tokens"),
    ("completions", {**GOOD, "max_tokens": "5"}, "max_tokens"),
    ("completions", {**GOOD, "prompt": [True, False]}, "prompt"),
    ("completions", {**GOOD, "prompt": [1, "a"]}, "prompt"),        # a mix of list kinds
    ("completions", {**GOOD, "prompt": [[1], 2]}, "prompt"),
    ("completions", {**GOOD, "logit_bias": {"1": "x"}}, "logit_bias"),
    ("completions", {**GOOD, "stream_options": {"include_usage": 1}, "stream": True},
     "stream_options"),
    ("completions", {**GOOD, "n": True}, "n"),
    ("completions", {**GOOD, "temperature": "0.5"}, "temperature"),
    ("completions", {**GOOD, "ignore_eos": 1}, "ignore_eos"),
    ("completions", {**GOOD, "temperature": -1}, "temperature"),
    ("completions", {**GOOD, "top_p": 2}, "top_p"),
    ("completions", {**GOOD, "max_tokens": 0}, "max_tokens"),
    ("completions", {**GOOD, "max_tokens": 5000}, "max_tokens"),
    ("completions", {**GOOD, "prompt": [4096]}, "prompt"),
    ("completions", {**GOOD, "prompt": [1] * 2000}, "prompt"),
    ("completions", {**GOOD, "prompt": ""}, "prompt"),
    ("completions", {**GOOD, "prompt": "ROMEO.\ud800"}, "prompt"),
    ("completions", {**GOOD, "stop": [""]}, "stop"),
    ("completions", {**GOOD, "logprobs": 21}, "logprobs"),
    ("completions", {**GOOD, "logit_bias": {"x": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {"4096": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "frequency_penalty": -3}, "frequency_penalty"),
    ("completions", {**GOOD, "repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {**GOOD, "min_p": 1.5}, "min_p"),
    ("completions", {**GOOD, "min_tokens": 99}, "min_tokens"),
    ("completions", {**GOOD, "best_of": 3, "stream": True}, "best_of"),
    ("completions", {**GOOD, "stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"model": 5, "prompt": PROMPT}, "model"),   # left out: the served one
    ("completions", {**GOOD, "use_beam_search": True}, "use_beam_search"),
    ("completions", {**GOOD, "allowed_token_ids": [1, 2]}, "allowed_token_ids"),
    ("completions", {**GOOD, "bad_words": ["lord"]}, "bad_words"),
    ("completions", {**GOOD, "cache_salt": "tenant-a"}, "cache_salt"),     # was ignored
    ("chat/completions", {**CHAT, "cache_salt": "tenant-a"}, "cache_salt"),
    # vLLM's per-request logits processors (its v1 engine refuses them): were ignored
    ("completions", {**GOOD, "logits_processors": ["my.module.Proc"]}, "logits_processors"),
    ("chat/completions", {**CHAT, "logits_processors": [{"qualname": "x"}]},
     "logits_processors"),
    ("chat/completions", {**CHAT, "chat_template": "{{ messages }}"}, "chat_template"),
    ("chat/completions", {**CHAT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("completions", {**GOOD, "prompt_logprobs": 21}, "prompt_logprobs"),
    ("chat/completions", {**CHAT, "continue_final_message": True}, "continue_final_message"),
    ("chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat/completions", {**CHAT, "max_completion_tokens": 5000}, "max_completion_tokens"),
    ("chat/completions", {**CHAT, "messages": []}, "messages"),
    # a prompt as long as the context: the field that holds it (chat has no `prompt`)
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": "ROMEO. " * 900}]},
     "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages"),
    ("chat/completions", {**CHAT, "messages": [{"content": "x"}]}, "messages"),
    ("chat/completions", {"model": "default"}, "messages"),
    ("chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("chat/completions", {**CHAT, "tool_choice": {"type": "function",
                                                  "function": {"name": "f"}}}, "tool_choice"),
    ("chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ("completions", {**GOOD, "structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs"),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}}, "response_format"),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "no-such-type"}}}], "tool_choice": "required"},
     "tools"),
    # in range as Python floats, 0 or infinite in the sampler's float32
    ("completions", {**GOOD, "top_p": 1e-300}, "top_p"),
    ("completions", {**GOOD, "top_p": 1e-46}, "top_p"),
    ("completions", {**GOOD, "repetition_penalty": 1e-300}, "repetition_penalty"),
    ("completions", {**GOOD, "repetition_penalty": 1e-40}, "repetition_penalty"),
    # logit_bias keys are token ids in decimal: no spaces, sign, "_", other digits, 0s
    ("completions", {**GOOD, "logit_bias": {" 5 ": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {"+5": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {"5_0": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {"\u0665": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {"05": 1.0}}, "logit_bias"),
    ("completions", {**GOOD, "logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ("completions", {**GOOD, "seed": 2 ** 64 - 1, "n": 2}, "seed"),
    ("completions", {**GOOD, "stop": ["a"] * 65}, "stop"),
    ("completions", {**GOOD, "stop_token_ids": [1] * 1025}, "stop_token_ids"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": ""}] * 4097},
     "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": ""}] * 1025}]}, "messages"),
]


@pytest.mark.parametrize("endpoint,body,param", PARAMS, ids=[f"{p}-{i}" for i, (_, _, p)
                                                             in enumerate(PARAMS)])
def test_every_400_names_its_field(http, endpoint, body, param):
    r = http.post(f"/v1/{endpoint}", content=json.dumps(body).encode(),   # \u escapes
                  headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_malformed_json_has_no_param(http):
    r = http.post("/v1/completions", content=b'{"model": ', headers={"content-type":
                                                                       "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] is None
    assert r.json()["error"]["message"].startswith("JSON decode error")


def test_unknown_fields_are_ignored_and_nulls_mean_the_default(http):
    r = http.post("/v1/completions", json={**GOOD, "frobnicate": {"x": [1]}, "top_p": None,
                                           "stop": None, "seed": None, "user": None})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    # vLLM's extras the engine cannot honour are refused only when they ask for something
    unasked = {"use_beam_search": None,
               "allowed_token_ids": [], "bad_words": None, "prompt_logprobs": None}
    assert http.post("/v1/completions", json={**GOOD, **unasked}).status_code == 200


@pytest.mark.filterwarnings("error::UserWarning")   # FastAPI's duplicate operation ids
def test_openapi_documents_the_request_bodies(http):
    schema = http.get("/openapi.json").json()
    body = schema["paths"]["/v1/completions"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    props = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    n = props["n"].get("anyOf", [props["n"]])      # null is allowed too (the default)
    assert {"type": "null"} in n and any(v.get("minimum") == 1 for v in n)
    assert "prompt" in props and "max_tokens" in props
    chat = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert chat["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    assert "ChatMessage" in schema["components"]["schemas"]


def test_official_client_gets_bad_request_with_param(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="default", max_tokens=4, tool_choice="required",
                                       messages=[{"role": "user", "content": "hi"}])
    assert exc.value.param == "tool_choice" and exc.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="default", prompt=PROMPT, max_tokens=True)
    assert exc.value.param == "max_tokens"
    out = client.completions.create(model="default", prompt=PROMPT, max_tokens=3)
    assert out.usage.completion_tokens == 3


@pytest.mark.parametrize("header,status", [
    (f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER  {KEY}", 200),
    (f"Basic {KEY}", 401), (KEY, 401), ("Bearer sk-wrong", 401), ("bearer", 401)])
def test_bearer_scheme_is_case_insensitive(server, header, status):
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": header})
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_slow_loris_is_cut_after_the_request_read_timeout(server, http):
    silent = connect(server)
    trickler = None
    try:
        silent.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        waited = closed_after(silent, every=0.2)
        assert READ_TIMEOUT - 0.3 < waited < READ_TIMEOUT + 5
        trickler = connect(server)
        headers = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n"
                   b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n{\"model\": ")
        waited = closed_after(trickler, headers * 4, every=0.2)    # bytes keep coming, slowly
        assert READ_TIMEOUT - 0.3 < waited < READ_TIMEOUT + 5
    finally:
        silent.close()
        if trickler is not None:
            trickler.close()
    assert http.post("/v1/completions", json=GOOD).status_code == 200   # others unaffected


def test_idle_keep_alive_connection_is_closed(server):
    sock = connect(server)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        waited = closed_after(sock, every=0.2)
        assert KEEP_ALIVE - 0.3 < waited < KEEP_ALIVE + 5
    finally:
        sock.close()


def test_over_limit_body_is_refused_before_it_is_read(server):
    """The Content-Length alone decides: the server answers 413 without the body (it never
    arrives), so nothing was parsed or tokenized."""
    sock = connect(server)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
                     f"\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode())
        answer = sock.recv(65536)
        while b"\r\n\r\n" not in answer or answer.endswith(b"\r\n\r\n"):
            answer += sock.recv(65536)       # the head, then the JSON body
    finally:
        sock.close()
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_drain_refuses_new_requests_with_503(server, http):
    drain = server.app.state.serve.drain
    drain.begin()
    try:
        r = http.post("/v1/completions", json=GOOD)
    finally:
        drain.draining = False
    assert r.status_code == 503 and r.headers["connection"] == "close"
    assert r.json()["error"]["code"] == "server_shutting_down"
    assert http.post("/v1/completions", json=GOOD).status_code == 200


def post_raw(http, body: bytes, path: str = "/v1/completions") -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


def server_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_invalid_utf8_is_a_400_not_a_500(http, caplog):
    """Bytes that are not UTF-8 inside a JSON string: msgspec < 0.23 raises
    UnicodeDecodeError (that was a 500 with a traceback in the log), 0.23 DecodeError
    (whose fallback read the body with the json module and said "'utf-8' codec ...");
    either way the 400 says what is wrong."""
    r = post_raw(http, b'{"model": "default", "prompt": "a\xff\xfeb", "max_tokens": 1}')
    assert r.status_code == 400, r.text
    assert "the request body is not valid UTF-8" in r.json()["error"]["message"]
    r = post_raw(http, b'{"model": "default", "prompt": "x", "logit_bias": {"1": "\xff"}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias"       # a string where a bias goes
    r = post_raw(http, b'{"model": "default", "prompt": "x", "x": ' + b"[" * 100_000 +
                 b"]" * 100_000 + b"}")
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    assert server_errors(caplog) == []


def test_a_client_leaving_mid_body_logs_no_traceback(server, http, caplog):
    sock = connect(server)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
        time.sleep(0.3)          # the server reads the part that came
    finally:
        sock.close()
    assert http.get("/health").status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not server_errors(caplog):
        if http.post("/v1/completions", json=GOOD).status_code == 200:
            break                # the request after it was served: the first is done
    assert server_errors(caplog) == []


def test_seed_error_names_the_seed_sent(http):
    r = http.post("/v1/completions", json={**GOOD, "seed": 2 ** 64 - 1, "n": 2})
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and str(2 ** 64 - 1) in msg and str(2 ** 64) + "," not in msg
    assert msg.startswith(f"seed must be at most {2 ** 64 - 2} with 2 choices"), msg
    assert http.post("/v1/completions", json={**GOOD, "seed": 2 ** 64 - 2, "n": 2,
                                               "max_tokens": 1}).status_code == 200


def test_logit_bias_keys_are_canonical_token_ids_given_once(http):
    """"5", "05" and "+5" were one token id, the last one silently kept."""
    for body in (b'{"model": "default", "prompt": "x", "logit_bias": {"5": 1, "5": -1}}',
                 b'{"model": "default", "prompt": "x", "logit_bias": {"5": 1, "05": -1}}'):
        r = post_raw(http, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    r = http.post("/v1/completions", json={**GOOD, "logit_bias": {"0": 1, "5": -1,
                                                                  "4095": 2.5}})
    assert r.status_code == 200, r.text


def test_trailing_slash_is_a_404_naming_the_route(http):
    r = http.post("/v1/completions/", json=GOOD)
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "not_found" and "the route is /v1/completions" in err["message"]
    assert http.get("/v1/models/").status_code == 404


def test_smallest_float32_safe_values_sample_finite_logprobs(http):
    """top_p at float32's smallest normal keeps the top token (greedy), and the strongest
    repetition penalty gives finite logprobs (1e-300 and 1e-40 were token 0 / NaN and
    infinite logits: now 400s, in PARAMS)."""
    greedy = http.post("/v1/completions", json={**GOOD, "temperature": 0, "max_tokens": 8,
                                                 "return_token_ids": True}).json()
    tiny = http.post("/v1/completions", json={
        **GOOD, "top_p": MIN_TOP_P, "max_tokens": 8, "seed": 3, "logprobs": 0,
        "return_token_ids": True}).json()
    assert tiny["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"], tiny
    assert all(math.isfinite(v) for v in tiny["choices"][0]["logprobs"]["token_logprobs"])
    rep = http.post("/v1/completions", json={
        **GOOD, "repetition_penalty": MIN_REPETITION_PENALTY, "max_tokens": 8,
        "temperature": 0, "logprobs": 1}).json()
    assert all(math.isfinite(v) and v > -9999 for v in
               rep["choices"][0]["logprobs"]["token_logprobs"]), rep


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_share_one_prompt_logprobs_list(http, stream):
    """echo + logprobs with n > 1: only choice 0 asks the engine for the prompt's
    logprobs; every choice shows them, equal to what n = 1 gets."""
    body = {**GOOD, "echo": True, "logprobs": 3, "max_tokens": 2, "temperature": 0}
    one = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    n = len(one["tokens"]) - 2          # the prompt's tokens
    if stream:
        with http.stream("POST", "/v1/completions", json={**body, "n": 3, "stream": True}) as r:
            firsts = {}
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        firsts.setdefault(c["index"], c["logprobs"])
        outs = [firsts[i] for i in range(3)]
    else:
        outs = [c["logprobs"] for c in
                http.post("/v1/completions", json={**body, "n": 3}).json()["choices"]]
    heads = [{key: out[key][:n] for key in out} for out in outs]
    assert all(head == heads[0] for head in heads)      # one list, shown n times
    # as n = 1 computes it (a batch of another shape may differ in the last bits)
    head = heads[0]
    assert head["tokens"] == one["tokens"][:n] and head["text_offset"] == one["text_offset"][:n]
    assert head["token_logprobs"][1:] == pytest.approx(one["token_logprobs"][1:n], abs=1e-4)

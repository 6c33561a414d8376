"""`roseplay serve` errors and cancellation: every status in OpenAI's error format (400,
401, 404, 413, 429, 503), client disconnects cancel their requests (blocks back to the
pool), and models without a tokenizer take token ids only. CPU, 127.0.0.1 only."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from engine.front.loop import EngineLoop
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread
from tests import helpers
from tests.roseplay.serve.raw_sockets import connect

KEY = "sk-test-key"
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"


@pytest.fixture(scope="module")
def loop():
    loop = EngineLoop(device="cpu")
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def server(loop):
    with ServerThread(build_app(loop)) as srv:
        yield srv


@pytest.fixture(scope="module")
def strict(loop):
    """The same engine behind a key, a 4 KiB body limit and --max-waiting 2."""
    config = ServeConfig(api_key=KEY, max_waiting=2, max_body_bytes=4096)
    with ServerThread(build_app(loop, config)) as srv:
        yield srv


def check_error(r: httpx.Response, status: int, code=None, in_message: str = "") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert in_message in err["message"] and err["code"] == code
    return err


def live(loop):
    return [r for r in loop.snapshot().requests if r.state not in ("finished", "cancelled", "error")]


def wait_for(cond, timeout: float = 20.0):
    return helpers.wait_for(cond, timeout)


# -- 400 -----------------------------------------------------------------------------------
BAD = [  # (endpoint, body changes, words of the message)
    ("completions", {"temperature": -1}, "temperature must be in [0, "),
    ("completions", {"top_p": 0}, "top_p must be in (0, 1]"),
    ("completions", {"max_tokens": 0}, "max_tokens must be an integer in [1, "),
    ("completions", {"top_k": -2}, "top_k must be an integer in [-1, "),
    ("completions", {"prompt": 5}, "prompt"),
    ("completions", {"prompt": ""}, "prompt is empty"),
    ("completions", {"prompt": [4096]}, "token ids must be in [0, 4096)"),
    ("completions", {"max_tokens": 2000}, "maximum context length is 1024"),
    ("completions", {"logprobs": 21}, "logprobs: Expected `int` <= 20"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty must be in [-2.0, 2.0]"),
    ("completions", {"logit_bias": {"1": 101}}, "logit_bias value must be in [-100.0, 100.0]"),
    ("completions", {"best_of": 1, "n": 2}, "best_of must be >= n"),
    ("completions", {"n": 0}, "n: Expected `int` >= 1"),
    ("completions", {"stream_options": {"include_usage": True}}, "only allowed when stream"),
    ("completions", {"stop": [""]}, "stop must be a non-empty string"),
    ("completions", {"priority": 2 ** 40}, "priority must be an integer in"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ("chat/completions", {"tools": [{"type": "function"}]}, "missing required field `function`"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
]


@pytest.mark.parametrize("endpoint,changes,words", BAD, ids=[f"{e}-{list(c)[0]}" for e, c, _ in BAD])
def test_invalid_parameters_are_400(server, endpoint, changes, words):
    base = {"model": "default", "max_tokens": 4}
    base.update({"prompt": PROMPT} if endpoint == "completions"
                else {"messages": [{"role": "user", "content": "hi"}]})
    r = httpx.post(f"{server.url}/v1/{endpoint}", json={**base, **changes})
    err = check_error(r, 400, in_message=words)
    assert err["type"] == "invalid_request_error"


JSON_BODIES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
               "/v1/completions": {"prompt": "hi"}, "/v1/responses": {"input": "hi"},
               "/invocations": {"prompt": "hi"}, "/tokenize": {"prompt": "hi"},
               "/detokenize": {"tokens": [1, 2]}}


@pytest.mark.parametrize("path", list(JSON_BODIES))
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          None])
def test_a_body_not_sent_as_json_is_400(server, path, content_type):
    """vLLM's JSON endpoints refuse any Content-Type but application/json with a 400
    (validate_json_request); a text/plain body (and curl -d's form type, and none) was
    read as JSON and served."""
    body = json.dumps({"model": "default", "max_tokens": 1, **JSON_BODIES[path]}).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        r = http.post(path, content=body, headers=headers)
        err = check_error(r, 400, in_message="Only 'application/json' is allowed")
        assert err["param"] is None and (content_type or "no Content-Type") in err["message"]
        for sent in ("application/json; charset=utf-8", "Application/JSON"):   # the same type
            assert http.post(path, content=body, headers={"content-type": sent}
                             ).status_code == 200


def test_malformed_json_is_400_not_422(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    check_error(r, 400, in_message="JSON decode error")


def test_openai_client_sees_bad_request(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError, match="temperature"):
            c.completions.create(model="default", prompt=PROMPT, temperature=-1)


# -- 401 / 404 / 413 -----------------------------------------------------------------------
def test_api_key_is_required_on_v1_only(strict):
    url = strict.url
    check_error(httpx.get(url + "/v1/models"), 401, "invalid_api_key", "API key")
    check_error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"}),
                401, "invalid_api_key")
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    # /server_info (what SGLang's router reads for a worker's model) tells what
    # /v1/models tells: keyed alike
    check_error(httpx.get(url + "/server_info"), 401, "invalid_api_key")
    info = httpx.get(url + "/server_info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["served_model_name"] == "default" and info["max_model_len"] == 1024
    # vLLM's /ping probe (SageMaker, load balancers), GET and POST, open as /health
    assert httpx.get(url + "/ping").status_code == 200
    assert httpx.post(url + "/ping").status_code == 200
    with openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.completions.create(model="default", prompt=PROMPT, max_tokens=2)
    with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as c:
        assert c.completions.create(model="default", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_unknown_model_and_route_are_404(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    err = check_error(r, 404, "model_not_found", "gpt-4")
    assert err["param"] == "model"
    check_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found")
    r = httpx.get(server.url + "/v1/completions")
    check_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"      # RFC 9110: a 405 names the methods allowed
    assert httpx.delete(server.url + "/ping").headers["allow"] == "GET, POST"
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])


def test_body_over_the_limit_is_413(strict, loop):
    n_before = len(loop.snapshot().requests)
    big = json.dumps({"model": "default", "prompt": "a " * 4000}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    check_error(httpx.post(strict.url + "/v1/completions", content=big, headers=headers),
                413, "request_too_large", "4096 bytes")

    def chunked():          # no Content-Length: the limit acts while the body is read
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]
    check_error(httpx.post(strict.url + "/v1/completions", content=chunked(), headers=headers),
                413, "request_too_large")
    assert len(loop.snapshot().requests) == n_before         # nothing reached the engine


# -- 429 -----------------------------------------------------------------------------------
def test_queue_over_max_waiting_is_429(strict, loop):
    """max_num_seqs=1: one stream runs, two wait for their first token (= --max-waiting 2),
    the next request is refused; once they are gone, requests are accepted again."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 900, "ignore_eos": True,
            "stream": True, "temperature": 0}
    loop.set_knobs(max_num_seqs=1)
    try:
        with httpx.Client(base_url=strict.url, headers=headers, timeout=60) as a, \
                httpx.Client(base_url=strict.url, headers=headers, timeout=60) as b:
            with a.stream("POST", "/v1/completions", json=body) as running:
                lines = running.iter_lines()    # keep it: a dropped iterator closes the connection
                next(line for line in lines if line.startswith("data: "))
                loop.pause()            # it must not finish (in ~1 s) before the check
                with b.stream("POST", "/v1/completions", json=body) as w1, \
                        b.stream("POST", "/v1/completions", json=body) as w2:
                    assert w1.status_code == w2.status_code == 200
                    wait_for(lambda: sum(r.state == "waiting" for r in live(loop)) == 2)
                    r = httpx.post(strict.url + "/v1/completions", headers=headers,
                                   json={**body, "stream": False, "max_tokens": 2})
                    check_error(r, 429, "queue_full", "--max-waiting 2")
                    assert r.json()["error"]["type"] == "rate_limit_error"
    finally:
        loop.resume()
        loop.set_knobs(max_num_seqs=64)
    wait_for(lambda: not live(loop) and loop.snapshot().num_used == 0)
    r = httpx.post(strict.url + "/v1/completions", headers=headers,
                   json={"model": "default", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200


# -- disconnects ------------------------------------------------------------------------------
def test_stream_disconnect_cancels_and_frees_blocks(server, loop):
    body = {"model": "default", "prompt": PROMPT * 8, "max_tokens": 800, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()           # keep it: a dropped iterator closes the connection
        first = next(line for line in lines if line.startswith("data: "))
        rid = json.loads(first[6:])["id"] + "-0"
        # a snapshot after its first token (the one before may show its last chunk in flight)
        wait_for(lambda: getattr(loop.snapshot().request(rid), "state", None) == "decoding")
        assert loop.snapshot().num_used > 0
    # the client is gone: the engine ends the request and its blocks leave the used pool
    wait_for(lambda: loop.snapshot().request(rid).state == "cancelled")
    wait_for(lambda: loop.snapshot().num_used == 0)
    view = loop.snapshot().request(rid)
    assert view.finish_reason == "cancelled" and view.output_tokens < 800 and view.blocks == ()


def test_many_clients_leaving_at_random_points_leak_nothing(server, loop):
    """50 streams, each leaves after 1-6 chunks: a request its client left is cancelled
    (or had just finished: under load the server coalesces many tokens into one chunk,
    so a stream can end within its client's 1-6 chunks), no block stays used and the
    server's waiting count is back to zero."""
    async def leave_after(http, i):
        body = {"model": "default", "prompt": f"{PROMPT} {i}", "max_tokens": 500,
                "ignore_eos": True, "stream": True, "seed": i}
        seen, rid = 0, None
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    rid = json.loads(line[6:])["id"] + "-0"
                    seen += 1
                    if seen > i % 6:
                        return rid, True
        return rid, False           # the stream ended first: the request finished

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=60)) as http:
            return await asyncio.gather(*(leave_after(http, i) for i in range(50)))
    ends = asyncio.run(run())
    wait_for(lambda: not live(loop) and loop.snapshot().num_used == 0)
    views = {rid: loop.snapshot().request(rid) for rid, _ in ends}
    assert all(v is not None for v in views.values()), views
    for rid, left in ends:
        v = views[rid]
        assert v.state in (("cancelled", "finished") if left else ("finished",)), (rid, v.state)
        assert v.state == "finished" or v.output_tokens < 500
    assert sum(views[rid].state == "cancelled" for rid, _ in ends) >= 25
    assert server.app.state.serve.bridge.pending == 0


def test_non_streaming_disconnect_cancels(server, loop):
    """A client that leaves during a non-streamed request cancels it mid-generation: the
    engine is paused once the request has tokens (so its 900 cannot finish first), then
    the client's socket is closed."""
    body = json.dumps({"model": "default", "prompt": PROMPT, "max_tokens": 900,
                       "ignore_eos": True}).encode()
    before = {r.request_id for r in loop.snapshot().requests}

    def mine():
        return next((r for r in loop.snapshot().requests if r.request_id not in before
                     and r.request_id.startswith("cmpl-")), None)
    sock = connect(server)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: (m := mine()) is not None and m.output_tokens > 0)
        loop.pause()
    finally:
        sock.close()
    try:
        wait_for(lambda: mine().state == "cancelled")
    finally:
        loop.resume()
    wait_for(lambda: not live(loop) and loop.snapshot().num_used == 0)
    assert mine().state == "cancelled" and 0 < mine().output_tokens < 900


def test_server_stop_with_an_open_stream_cancels_it(loop):
    srv = ServerThread(build_app(loop, ServeConfig(shutdown_timeout=1))).start()
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 900, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        rid = json.loads(next(line for line in lines if line.startswith("data: "))[6:])["id"]
        loop.pause()                         # 900 tokens finish within a second on cpu_native
        t0 = time.monotonic()
        srv.stop()                           # a 1 s drain, then the stream is ended
        assert time.monotonic() - t0 < 10 and not srv._thread.is_alive()
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and srv.server.exit_code == 3
    assert json.loads(rest[-2][6:])["error"]["message"].startswith("the server is shutting down")
    try:
        wait_for(lambda: loop.snapshot().request(rid + "-0") is not None
                 and loop.snapshot().request(rid + "-0").state == "cancelled")
    finally:
        loop.resume()
    wait_for(lambda: loop.snapshot().num_used == 0)


# -- models without a tokenizer, stopped engines ----------------------------------------------
def test_dummy_model_takes_token_ids_only():
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as dummy, \
            ServerThread(build_app(dummy)) as srv:
        base = {"model": "dummy:tiny", "max_tokens": 5, "ignore_eos": True}
        check_error(httpx.post(srv.url + "/v1/completions", json={**base, "prompt": "hi"}),
                    400, in_message="send the prompt as token ids")
        err = check_error(httpx.post(srv.url + "/v1/chat/completions", json={
            **base, "messages": [{"role": "user", "content": "hi"}]}), 400,
            in_message="no tokenizer")
        assert err["param"] == "messages"
        err = check_error(httpx.post(srv.url + "/v1/responses", json={
            "model": "dummy:tiny", "input": "hi"}), 400, in_message="no tokenizer")
        assert err["param"] == "input" and "/v1/responses" in err["message"]
        r = httpx.post(srv.url + "/v1/completions", json={**base, "prompt": [1, 2, 3],
                                                          "return_token_ids": True})
        choice = r.json()["choices"][0]
        assert r.status_code == 200 and len(choice["token_ids"]) == 5 and choice["text"] == ""


def test_stopped_engine_is_503():
    dummy = EngineLoop(model="dummy:tiny", device="cpu", num_blocks=16)
    with ServerThread(build_app(dummy)) as srv:
        dummy.close()
        r = httpx.post(srv.url + "/v1/completions", json={"model": "dummy:tiny",
                                                         "prompt": [1, 2], "max_tokens": 2})
        check_error(r, 503, "engine_unavailable", "stopped")


def test_slow_reader_does_not_hold_back_the_engine(server, loop):
    """A streaming client that reads nothing (a tiny receive buffer, never drained): its
    request still runs to the end in the engine, another client's request is served
    meanwhile, and closing the socket leaves nothing behind."""
    import socket
    body = json.dumps({"model": "default", "prompt": PROMPT, "max_tokens": 300,
                       "ignore_eos": True, "stream": True}).encode()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    slow.connect((server.host, server.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        wait_for(lambda: any(r.state == "decoding" for r in live(loop)))
        rid = next(r.request_id for r in live(loop) if r.state == "decoding")
        good = {"model": "default", "prompt": "ROMEO:", "max_tokens": 16, "temperature": 0}
        r = httpx.post(server.url + "/v1/completions", json=good, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        # the slow reader's request is not throttled to its reading speed (nothing)
        wait_for(lambda: loop.snapshot().request(rid).state == "finished", 60)
        assert loop.snapshot().request(rid).output_tokens == 300
    finally:
        slow.close()
    wait_for(lambda: not live(loop) and loop.snapshot().num_used == 0)

"""Request ids over HTTP, as vLLM's server: X-Request-Id (else the body's request_id)
names the response's id, --enable-request-id-headers echoes it, and engine ids stay
unique however many clients send the same header (the engine refuses a duplicate)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.cli import build_parser, serve_config
from roseplay.serve.request_ids import MAX_CLIENT_ID_CHARS
from roseplay.serve.server import ServerThread

CHAT = {"model": "default", "max_tokens": 3, "messages": [{"role": "user", "content": "Hail"}]}
COMPLETION = {"model": "default", "prompt": "ROMEO.\n", "max_tokens": 3}
RESPONSE = {"model": "default", "input": "Hail", "max_output_tokens": 3}


@pytest.fixture(scope="module")
def loop():
    loop = EngineClient(device="cpu")
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def echoing(loop):
    with ServerThread(build_app(loop, ServeConfig(enable_request_id_headers=True))) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain(loop):
    with ServerThread(build_app(loop, ServeConfig())) as srv:
        yield srv


def engine_ids(loop, prefix: str) -> list[str]:
    return [r.request_id for r in loop.snapshot().requests if r.request_id.startswith(prefix)]


def test_header_names_the_response_id_on_every_endpoint(echoing):
    with httpx.Client(base_url=echoing.url, timeout=60) as http:
        for path, body, want in (("/v1/completions", COMPLETION, "cmpl-trace-1"),
                                 ("/v1/chat/completions", CHAT, "chatcmpl-trace-1"),
                                 ("/v1/responses", RESPONSE, "resp_trace-1")):
            r = http.post(path, json=body, headers={"X-Request-Id": "trace-1"})
            assert r.status_code == 200, r.text
            assert r.json()["id"] == want
            assert r.headers["x-request-id"] == "trace-1"


def test_body_request_id_is_the_base_and_the_header_wins(echoing):
    with httpx.Client(base_url=echoing.url, timeout=60) as http:
        r = http.post("/v1/chat/completions", json={**CHAT, "request_id": "from-body"})
        assert r.json()["id"] == "chatcmpl-from-body"
        assert r.headers["x-request-id"] == "from-body"
        r = http.post("/v1/completions", json={**COMPLETION, "request_id": "from-body"},
                      headers={"X-Request-Id": "from-header"})
        assert r.json()["id"] == "cmpl-from-header"
        assert r.headers["x-request-id"] == "from-header"
        # vLLM's Responses body request_id is the whole id ("resp_..." by default)
        r = http.post("/v1/responses", json={**RESPONSE, "request_id": "resp_abc"})
        assert r.json()["id"] == "resp_abc" and r.headers["x-request-id"] == "abc"


def test_generated_id_is_echoed_and_names_the_response(echoing):
    """Without a client id the header echoes the base of the id the server made; every
    other response (health, errors of the gate) carries a fresh one."""
    with httpx.Client(base_url=echoing.url, timeout=60) as http:
        r = http.post("/v1/chat/completions", json=CHAT)
        assert r.json()["id"] == "chatcmpl-" + r.headers["x-request-id"]
        a, b = http.get("/health"), http.get("/health")
        assert a.headers["x-request-id"] and a.headers["x-request-id"] != b.headers["x-request-id"]
        assert http.get("/health", headers={"X-Request-Id": "probe"}).headers["x-request-id"] == "probe"
        bad = http.post("/v1/completions", json={**COMPLETION, "max_tokens": "5"},
                        headers={"X-Request-Id": "bad-1"})
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"


def test_streamed_chunks_carry_the_id_with_the_openai_client(echoing):
    with openai.OpenAI(base_url=echoing.url + "/v1", api_key="-", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            **CHAT, stream=True, extra_headers={"X-Request-Id": "stream-7"})
        assert raw.headers["x-request-id"] == "stream-7"
        ids = {chunk.id for chunk in raw.parse()}
        assert ids == {"chatcmpl-stream-7"}
        r = client.completions.create(**COMPLETION, extra_headers={"X-Request-Id": "sdk-1"})
        assert r.id == "cmpl-sdk-1"


def test_same_header_at_once_never_collides(echoing, loop):
    """Eight clients send one X-Request-Id at the same time (n=2 each): every request
    succeeds, each response has the client's id, the engine's ids are all distinct."""
    async def one(http):
        r = await http.post("/v1/completions", json={**COMPLETION, "n": 2, "max_tokens": 8},
                            headers={"X-Request-Id": "same"})
        return r.status_code, r.json()

    async def run():
        async with httpx.AsyncClient(base_url=echoing.url, timeout=120) as http:
            return await asyncio.gather(*(one(http) for _ in range(8)))
    results = asyncio.run(run())
    assert [status for status, _ in results] == [200] * 8, results
    assert {body["id"] for _, body in results} == {"cmpl-same"}
    assert all(len(body["choices"]) == 2 for _, body in results)
    assert loop.wait_idle(30)
    deadline = time.monotonic() + 30         # snapshots are published periodically
    while len(ids := engine_ids(loop, "cmpl-same-")) < 16 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ids) == len(set(ids)) == 16


def test_header_without_the_flag_names_the_id_but_is_not_echoed(plain):
    with httpx.Client(base_url=plain.url, timeout=60) as http:
        r = http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "quiet"})
        assert r.json()["id"] == "chatcmpl-quiet" and "x-request-id" not in r.headers


def test_odd_and_long_client_ids(echoing):
    """Any visible header value names the id (the engine's id keeps only safe characters);
    one over MAX_CLIENT_ID_CHARS is a 400; a body id a header cannot carry is not echoed."""
    with httpx.Client(base_url=echoing.url, timeout=60) as http:
        r = http.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": "a b/c?"})
        assert r.status_code == 200 and r.json()["id"] == "cmpl-a b/c?"
        long = "x" * (MAX_CLIENT_ID_CHARS + 1)
        r = http.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": long})
        assert r.status_code == 400 and "X-Request-Id" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={**COMPLETION, "request_id": long})
        assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"
        r = http.post("/v1/completions", json={**COMPLETION, "request_id": "line\nbreak"})
        assert r.status_code == 200 and r.json()["id"] == "cmpl-line\nbreak"
        assert r.headers["x-request-id"] and "\n" not in r.headers["x-request-id"]
        r = http.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": ""})
        assert r.status_code == 200 and r.json()["id"] != "cmpl-"


def test_cli_flag():
    p = build_parser()
    assert "X-Request-Id" in p.format_help()
    assert serve_config(p.parse_args(["--enable-request-id-headers"])).enable_request_id_headers
    assert not serve_config(p.parse_args([])).enable_request_id_headers

"""vLLM's usage flags: --enable-prompt-tokens-details (usage.prompt_tokens_details.
cached_tokens where the prefix cache served any) and --enable-force-include-usage (every
stream ends with its usage chunk). Neither flag was served. The engine in its own
process, the bundled model (16-token KV blocks), 127.0.0.1."""
from __future__ import annotations

import json

import httpx
import pytest

from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.cli import build_parser, serve_config
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)
PROMPT = "ROMEO.\nWhat news from the court? Speak, good Balthasar, what news? " * 3
CHAT = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def http():
    config = ServeConfig(enable_prompt_tokens_details=True, enable_force_include_usage=True)
    with EngineClient(label="server", snapshots=False) as engine, \
            ServerThread(build_app(engine, config)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


def stream_usage(http, path: str, body: dict) -> dict | None:
    """The usage of a stream's last chunk before [DONE] (None: no usage chunk)."""
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return chunks[-1]["usage"] if not chunks[-1]["choices"] else None


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "temperature": 0}),
])
def test_prompt_tokens_details_count_the_cached_prompt(http, path, body):
    first = http.post(path, json=body).json()["usage"]
    again = http.post(path, json=body).json()["usage"]
    assert first["prompt_tokens"] == again["prompt_tokens"] > 32
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 16 <= cached < again["prompt_tokens"] and cached % 16 == 0, again
    # streamed: the usage chunk carries them too, with no stream_options (forced)
    streamed = stream_usage(http, path, body)
    assert streamed["prompt_tokens_details"] == {"cached_tokens": cached}, streamed
    assert streamed["prompt_tokens"] == again["prompt_tokens"]


def test_an_uncached_prompt_has_null_details_and_streams_end_with_usage(http):
    body = {"prompt": "JULIET.\nAy me!", "max_tokens": 2, "temperature": 0}
    assert http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"] \
        is None
    u = stream_usage(http, "/v1/completions", {**body, "prompt": "KING.\nWell met."})
    assert u is not None and "prompt_tokens_details" not in u
    u = stream_usage(http, "/v1/completions", {**body, "stream_options": {
        "include_usage": False}})
    assert u is not None and u["completion_tokens"] == 2


def test_the_flags_reach_the_config():
    args = build_parser().parse_args(["--enable-prompt-tokens-details",
                                      "--enable-force-include-usage"])
    config = serve_config(args)
    assert config.enable_prompt_tokens_details and config.enable_force_include_usage
    config = serve_config(build_parser().parse_args([]))
    assert not (config.enable_prompt_tokens_details or config.enable_force_include_usage)

"""Top logprobs in vLLM's order: a token's logprobs dict, the sampled token first, then
the top n by rank, each id once; chat (and Responses) list its first `top_logprobs`,
completions its first `logprobs` + 1 keyed by text. roseplay listed the true top n, so a
sampled token that was not the likeliest came later (chat) or last (completions), or not
at all in chat. Sampled at temperature 2 with a seed, so some tokens are not the
likeliest; the engine in its own process, the bundled model, 127.0.0.1."""
from __future__ import annotations

import httpx
import pytest

from engine.front.client import EngineClient
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)
K = 3
SAMPLED = {"max_tokens": 40, "temperature": 2.0, "seed": 11}


@pytest.fixture(scope="module")
def http():
    with EngineClient(label="server", snapshots=False) as engine, \
            ServerThread(build_app(engine)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


def test_chat_top_logprobs_start_with_the_sampled_token(http):
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What news?"}], "logprobs": True,
        "top_logprobs": K, **SAMPLED})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    unlikely = 0
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == K
        assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])
        rest = [t["logprob"] for t in top[1:]]
        assert rest == sorted(rest, reverse=True)      # then by rank
        unlikely += any(v > entry["logprob"] for v in rest)
    assert unlikely, "every token was the likeliest: the order was not put to the test"


def test_completion_top_logprobs_key_the_sampled_token_first(http):
    r = http.post("/v1/completions", json={"prompt": "ROMEO.\n", "logprobs": K, **SAMPLED})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    unlikely = 0
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        first = next(iter(top.items()))
        assert first == (token, value)
        rest = list(top.values())[1:]
        assert rest == sorted(rest, reverse=True)
        # the top K and the sampled one, once (fewer where two ids share a text)
        assert len(top) <= K + 1
        unlikely += max(rest) > value
    assert unlikely, "every token was the likeliest: the order was not put to the test"


def test_top_logprobs_0_lists_none_in_chat_and_the_sampled_token_in_completions(http):
    chat = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What news?"}], "logprobs": True,
        "top_logprobs": 0, **SAMPLED, "max_tokens": 4}).json()
    assert all(e["top_logprobs"] == [] for e in chat["choices"][0]["logprobs"]["content"])
    lp = http.post("/v1/completions", json={"prompt": "ROMEO.\n", "logprobs": 0, **SAMPLED,
                                            "max_tokens": 4}).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"])]

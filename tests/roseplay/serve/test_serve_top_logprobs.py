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
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)
K = 3
SAMPLED = {"max_tokens": 40, "temperature": 2.0, "seed": 11}


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


def test_return_tokens_as_token_ids_names_tokens_by_id(http):
    """vLLM's return_tokens_as_token_ids: each logprobs token (and its top entries) is
    "token_id:N"; it was ignored and the texts came back. Offsets and bytes stay the
    text's."""
    body = {"prompt": "ROMEO.\n", "logprobs": 1, "max_tokens": 4, "temperature": 0,
            "return_token_ids": True}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]
    named = http.post("/v1/completions", json={**body, "return_tokens_as_token_ids": True}
                      ).json()["choices"][0]
    assert named["logprobs"]["tokens"] == [f"token_id:{t}" for t in plain["token_ids"]]
    assert named["logprobs"]["text_offset"] == plain["logprobs"]["text_offset"]
    assert [next(iter(top)) for top in named["logprobs"]["top_logprobs"]] == \
        named["logprobs"]["tokens"]
    chat = {"messages": [{"role": "user", "content": "What news?"}], "logprobs": True,
            "top_logprobs": 1, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    plain = http.post("/v1/chat/completions", json=chat).json()["choices"][0]
    named = http.post("/v1/chat/completions", json={**chat, "return_tokens_as_token_ids": True}
                      ).json()["choices"][0]
    content = named["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in plain["token_ids"]]
    assert [e["bytes"] for e in content] == [e["bytes"] for e in plain["logprobs"]["content"]]
    assert [e["top_logprobs"][0]["token"] for e in content] == [e["token"] for e in content]


def test_the_server_flag_sets_the_default():
    """--return-tokens-as-token-ids: requests that leave the field out (or null) get ids;
    false still gets texts."""
    body = {"prompt": "ROMEO.\n", "logprobs": 0, "max_tokens": 2, "temperature": 0,
            "return_token_ids": True}
    with EngineClient(label="server", snapshots=False) as engine, \
            ServerThread(build_app(engine, ServeConfig(return_tokens_as_token_ids=True))) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        for extra in ({}, {"return_tokens_as_token_ids": None}):
            c = client.post("/v1/completions", json={**body, **extra}).json()["choices"][0]
            assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
        c = client.post("/v1/completions", json={**body, "return_tokens_as_token_ids": False}
                        ).json()["choices"][0]
        assert not any(t.startswith("token_id:") for t in c["logprobs"]["tokens"])


def check_prompt_logprobs(got: list, prompt_ids: list[int], k: int) -> None:
    """vLLM's prompt_logprobs: None for the first token, then per token its dict, the
    token's own entry first (its rank), then the top k by rank, each id once."""
    assert len(got) == len(prompt_ids) and got[0] is None
    for entry, token in zip(got[1:], prompt_ids[1:]):
        keys = list(entry)
        assert keys[0] == str(token) and len(keys) <= k + 1
        ranks = [entry[key]["rank"] for key in keys[1:]]
        assert ranks == sorted(ranks) and all(1 <= r <= k for r in ranks)
        assert all(set(v) == {"logprob", "rank", "decoded_token"} for v in entry.values())


def test_prompt_logprobs_are_served_as_vllm_s(http):
    """vLLM's prompt_logprobs (completions: each choice its prompt's; chat: the
    response's; not streamed): they were refused, though the engine computes them."""
    body = {"prompt": ["ROMEO.\nWhat news?", "JULIET.\nAy me!"], "max_tokens": 2, "n": 2,
            "temperature": 0, "prompt_logprobs": 2, "return_token_ids": True}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    for c in choices:
        check_prompt_logprobs(c["prompt_logprobs"], c["prompt_token_ids"], 2)
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    # the same numbers as echo + logprobs gives the echoed prompt
    echo = http.post("/v1/completions", json={**body, "prompt": body["prompt"][0], "n": 1,
                                              "echo": True, "logprobs": 1}).json()["choices"][0]
    own = [e[str(t)]["logprob"] for e, t in zip(choices[0]["prompt_logprobs"][1:],
                                                 choices[0]["prompt_token_ids"][1:])]
    # (within float noise: the two ran in batches of other sizes)
    assert own == pytest.approx(echo["logprobs"]["token_logprobs"][1:len(own) + 1], abs=1e-3)
    for entry in choices[0]["prompt_logprobs"][1:]:      # each id decoded alone
        for key, value in entry.items():
            text = http.post("/detokenize", json={"tokens": [int(key)]}).json()["prompt"]
            assert value["decoded_token"] == text

    chat = {"messages": [{"role": "user", "content": "What news?"}], "max_tokens": 2,
            "prompt_logprobs": 0, "return_token_ids": True}
    r = http.post("/v1/chat/completions", json=chat).json()
    check_prompt_logprobs(r["prompt_logprobs"], r["prompt_token_ids"], 0)
    # streamed: 0 asks for nothing (as vLLM), more is a 400 naming the field
    with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as s:
        assert s.status_code == 200
    r = http.post("/v1/chat/completions", json={**chat, "stream": True, "prompt_logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"

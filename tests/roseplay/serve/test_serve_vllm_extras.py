"""vLLM's extra request fields, as a vLLM client reads their answers (the engine in its
own process, the bundled model, 127.0.0.1)."""
from __future__ import annotations

import json

import httpx
import pytest

from engine import LLM
from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.body import parse_body
from roseplay.serve.prompts import completion_inputs
from roseplay.serve.protocol import CompletionRequest
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)
PROMPTS = ["ROMEO.\nWhat news?", "JULIET.\nAy me!"]
MESSAGES = [{"role": "user", "content": "What news from the court?"}]


@pytest.fixture(scope="module")
def engine():
    with EngineClient(label="server", snapshots=False) as engine:
        yield engine


@pytest.fixture(scope="module")
def http(engine):
    with ServerThread(build_app(engine)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


def chunks(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_return_token_ids_gives_the_prompt_token_ids(http):
    """vLLM's return_token_ids answers prompt_token_ids too (completions: in each choice;
    chat: in the response; streamed: a choice's first chunk), the ids /tokenize gives;
    only token_ids came back."""
    want = [http.post("/tokenize", json={"prompt": p}).json()["tokens"] for p in PROMPTS]
    body = {"model": "default", "prompt": PROMPTS, "n": 2, "max_tokens": 3,
            "return_token_ids": True}
    choices = http.post("/v1/completions", json=body).json()["choices"]
    assert [c["prompt_token_ids"] for c in choices] == [want[0], want[0], want[1], want[1]]
    streamed = [c for chunk in chunks(http, "/v1/completions", body) for c in chunk["choices"]]
    firsts = {}
    for c in streamed:
        if "prompt_token_ids" in c:
            assert c["index"] not in firsts
            firsts[c["index"]] = c["prompt_token_ids"]
    assert firsts == {0: want[0], 1: want[0], 2: want[1], 3: want[1]}

    chat_ids = http.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    body = {"model": "default", "messages": MESSAGES, "n": 2, "max_tokens": 3,
            "return_token_ids": True}
    assert http.post("/v1/chat/completions", json=body).json()["prompt_token_ids"] == chat_ids
    got = [(chunk["choices"][0]["index"], chunk["prompt_token_ids"])
           for chunk in chunks(http, "/v1/chat/completions", body) if "prompt_token_ids" in chunk]
    assert sorted(got) == [(0, chat_ids), (1, chat_ids)]
    plain = http.post("/v1/chat/completions", json={**body, "return_token_ids": False}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_x_data_parallel_rank_header_pins_the_replica():
    """vLLM's X-data-parallel-rank header (what routers in front of vLLM send) pins the
    replica, as the body's data_parallel_rank does, and wins over it; it was ignored."""
    body = {"model": "dummy:tiny", "prompt": [5, 6, 7, 8], "max_tokens": 2, "temperature": 0}
    with LLM(model="dummy:tiny", device="cpu", num_blocks=256, block_size=4, seed=0,
             data_parallel_size=2, routing_policy="round_robin") as llm, \
            ServerThread(build_app(llm.dp)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        for rank in (1, 1, 0, 1):
            r = client.post("/v1/completions", json=body,
                            headers={"X-data-parallel-rank": str(rank)})
            assert r.status_code == 200, r.text
            assert llm.dp.router.recent[-1].chosen == rank
        r = client.post("/v1/completions", json={**body, "data_parallel_rank": 0},
                        headers={"X-Data-Parallel-Rank": "1"})
        assert r.status_code == 200 and llm.dp.router.recent[-1].chosen == 1
        for bad in ("2", "one", "-1"):
            r = client.post("/v1/completions", json=body, headers={"X-data-parallel-rank": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "data_parallel_rank"


def test_sagemaker_invocations_take_a_chat_or_a_completion(http, engine):
    """vLLM's POST /invocations (SageMaker's route, beside /ping): a body with messages is
    a chat completion, one with prompt a completion, streamed or not; it was a 404."""
    chat = {"model": "default", "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    cmpl = {"model": "default", "prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0}
    for path, body, key in (("/v1/chat/completions", chat, "message"),
                            ("/v1/completions", cmpl, "text")):
        want = http.post(path, json=body).json()
        got = http.post("/invocations", json=body)
        assert got.status_code == 200, got.text
        assert got.json()["object"] == want["object"]
        assert got.json()["choices"][0][key] == want["choices"][0][key]
        assert [c["object"] for c in chunks(http, "/invocations", body)][0] == \
            want["object"] + (".chunk" if key == "message" else "")
    r = http.post("/invocations", json={"model": "default", "input": "Hail"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = http.post("/invocations", json={**chat, "max_tokens": "5"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    with ServerThread(build_app(engine, ServeConfig(api_key="k"))) as srv:
        assert httpx.post(srv.url + "/invocations", json=chat).status_code == 401
        assert httpx.post(srv.url + "/invocations", json=chat, timeout=60,
                          headers={"Authorization": "Bearer k"}).status_code == 200


class BosTokenizer:
    """A tokenizer whose special token is a BOS (1), as Llama's: one char, one id."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * add_special_tokens + [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids if i != 1)


@pytest.mark.parametrize("sent,want", [({}, [1, 72, 105]),
                                       ({"add_special_tokens": True}, [1, 72, 105]),
                                       ({"add_special_tokens": False}, [72, 105])])
def test_completions_add_special_tokens(sent, want):
    """vLLM's add_special_tokens on /v1/completions (true by default: the encode adds
    BOS); false was ignored, so a prompt that carries its own BOS got two."""
    req = parse_body(CompletionRequest, json.dumps({"prompt": "Hi", **sent}).encode())
    ins = completion_inputs(req, BosTokenizer(), 64, 256)
    assert ins.prompts[0]["prompt_token_ids"] == want and ins.prompt_lens == [len(want)]


def test_chat_add_special_tokens_true_is_refused(http):
    """Chat's default is false, as vLLM's (the template writes the special tokens); true
    is a 400 naming the field, as /tokenize's, not ignored."""
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 2}
    assert http.post("/v1/chat/completions", json={**body, "add_special_tokens": False}) \
        .status_code == 200
    r = http.post("/v1/chat/completions", json={**body, "add_special_tokens": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"

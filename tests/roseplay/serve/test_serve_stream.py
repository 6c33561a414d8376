"""The streaming path of `roseplay serve` on its default engine (its own process, the
bundled model, CPU, 127.0.0.1): coalesced chunks are the pydantic models' JSON, a
loaded server's streams still add up to the non-streamed text with usage and
finish_reason (the official openai client reads them), and the server's own TTFT / TPOT /
E2E histograms agree with what the load client measured."""
from __future__ import annotations

import asyncio
import gc
import json
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.front.client import EngineClient
from roseplay.bench.clients import Job, run_load
from roseplay.serve.app import build_app
from roseplay.serve.responses import (ChatChunkChoice, ChatCompletionChunk, CompletionChoice,
                                      CompletionResponse, DeltaMessage, PromptTokensDetails,
                                      usage)
from roseplay.serve import formats
from roseplay.serve.server import ServerThread
from roseplay.serve.streaming import ChunkEncoder, coalesce, usage_chunk

PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
pytestmark = pytest.mark.timeout(120)


def event(rid, ids, text, finished=False, reason=None, error=None):
    return SimpleNamespace(request_id=rid, token_ids=tuple(ids), text=text, finished=finished,
                           finish_reason=reason, error=error)


CREATED = 1_700_000_000


def fmt(prefix: str, return_token_ids: bool, echo: bool = False):
    req = SimpleNamespace(return_token_ids=return_token_ids, echo=echo, echo_only=False,
                          continuous_usage=False)
    return SimpleNamespace(prefix=prefix, req=req, id="cmpl-x", model="m", created=CREATED,
                           _echo=lambda i: "PROMPT ",
                           prompt_ids=lambda i: [9, 8] if return_token_ids else None)


def test_coalesce_joins_a_choices_events_in_order():
    a, b = SimpleNamespace(index=0), SimpleNamespace(index=1)
    pieces, errors = coalesce([(a, event("r0", [1], "to")), (b, event("r1", [7], "X")),
                               (a, event("r0", [2, 3], " be")), (b, event("r1", [], "", True,
                                                                          "error", "boom")),
                               (a, event("r0", [4], "!", True, "length"))])
    assert errors == ["boom"] and len(pieces) == 2
    assert (pieces[0].text, pieces[0].token_ids, pieces[0].finish_reason) == \
        ("to be!", [1, 2, 3, 4], "length")
    assert (pieces[1].choice, pieces[1].text, pieces[1].finished) == (b, "X", False)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("ids", [False, True])
def test_chunks_are_the_pydantic_models_json(chat, ids):
    enc = ChunkEncoder(fmt("chatcmpl" if chat else "cmpl", ids))
    (piece,), _ = coalesce([(SimpleNamespace(index=2), event("r", [5, 6], "é\n\"q\"", True,
                                                             "cancelled"))])
    for first in (True, False):
        raw = enc.chunk(piece, first)
        assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
        kw = dict(finish_reason="abort", token_ids=[5, 6] if ids else None)
        prompt_ids = [9, 8] if ids and first else None     # vLLM's: the first chunk's
        if chat:
            choice = ChatChunkChoice(index=2, delta=DeltaMessage(
                role="assistant" if first else None, content="é\n\"q\""), **kw)
            model = ChatCompletionChunk(id="cmpl-x", model="m", choices=[choice],
                                        prompt_token_ids=prompt_ids)
        else:
            model = CompletionResponse(id="cmpl-x", model="m", choices=[
                CompletionChoice(index=2, text="é\n\"q\"", prompt_token_ids=prompt_ids, **kw)])
        want = json.loads(model.model_dump_json())
        got = json.loads(raw[6:])
        want.pop("created")      # the model's own clock; a chunk carries the response's
        assert got.pop("created") == CREATED and got == want


@pytest.mark.parametrize("model,obj", [(CompletionResponse, "text_completion"),
                                       (ChatCompletionChunk, "chat.completion.chunk")])
@pytest.mark.parametrize("cached", [None, 16])
def test_usage_chunk_is_the_pydantic_models_json(model, obj, cached):
    """... but for a null prompt_tokens_details, which vLLM's usage chunk leaves out."""
    u = usage(7, 3)
    if cached is not None:
        u.prompt_tokens_details = PromptTokensDetails(cached_tokens=cached)
    raw = usage_chunk("cmpl-x", obj, "m", u, CREATED)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    want = json.loads(model(id="cmpl-x", created=CREATED, model="m", choices=[],
                            usage=u).model_dump_json())
    if cached is None:
        assert want["usage"].pop("prompt_tokens_details") is None
    assert json.loads(raw[6:]) == want


def test_echo_goes_with_the_first_chunk_only():
    enc = ChunkEncoder(fmt("cmpl", False, echo=True))
    (piece,), _ = coalesce([(SimpleNamespace(index=0), event("r", [5], "a"))])
    texts = [json.loads(enc.chunk(piece, first)[6:])["choices"][0]["text"]
             for first in (True, False)]
    assert texts == ["PROMPT a", "a"]


@pytest.fixture(scope="module")
def loop():
    with EngineClient(device="cpu", label="test-stream", snapshots=False) as client:
        yield client


@pytest.fixture(scope="module")
def server(loop):
    with ServerThread(build_app(loop)) as srv:
        yield srv


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.labels.get("le")}


def test_concurrent_streams_add_up_to_the_non_streamed_text(server):
    """32 streams at once (a step's events queue up and go out coalesced): each stream's
    text and token ids add up to the same request not streamed, with usage and finish."""
    def body(i, stream):
        return {"model": "default", "prompt": f"{PROMPT}{i}", "max_tokens": 24,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}

    async def streamed(http, i):
        text, ids, finish, usage, chunks = "", [], None, None, 0
        async with http.stream("POST", "/v1/completions", json=body(i, True)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                for c in data["choices"]:
                    text, chunks = text + c["text"], chunks + 1
                    ids += c["token_ids"]
                    finish = c["finish_reason"] or finish
                usage = data["usage"] or usage
        return text, ids, finish, usage, chunks

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            streams = await asyncio.gather(*(streamed(http, i) for i in range(32)))
            plain = [(await http.post("/v1/completions", json=body(i, False))).json()
                     for i in range(32)]
        return streams, plain
    streams, plain = asyncio.run(run())
    for (text, ids, finish, usage, chunks), ref in zip(streams, plain):
        choice = ref["choices"][0]
        assert (text, ids, finish) == (choice["text"], choice["token_ids"], "length")
        assert usage["completion_tokens"] == len(ids) == 24 and 1 <= chunks <= 24


def test_the_openai_client_streams_a_chat_with_usage(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0) as c:
        chunks = list(c.chat.completions.create(
            model="default", stream=True, temperature=0, max_tokens=16,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "What news from the court?"}]))
        full = c.chat.completions.create(model="default", temperature=0, max_tokens=16,
                                         messages=[{"role": "user",
                                                    "content": "What news from the court?"}])
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == full.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == \
        full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens


def test_a_chat_streams_its_role_in_each_choices_first_delta_only(server):
    """OpenAI and vLLM send `"role": "assistant"` in a choice's first delta and leave the
    key out of the later ones; every later delta carried `"role":null` (read from the raw
    SSE bytes: the openai client reads a missing role and a null one alike). A loaded box
    may join a choice's tokens into fewer deltas (streaming.coalesce), even one: 48
    tokens leave later deltas in practice, and the rule is checked on those there are."""
    body = {"model": "default", "stream": True, "temperature": 0, "max_tokens": 48, "n": 2,
            "ignore_eos": True, "messages": [{"role": "user", "content": "What news?"}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_bytes())
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and b'"role":null' not in raw
    deltas = {0: [], 1: []}
    for e in events[:-1]:
        for c in json.loads(e.removeprefix(b"data: "))["choices"]:
            deltas[c["index"]].append(c["delta"])
    for ds in deltas.values():
        assert ds and ds[0]["role"] == "assistant"
        assert all("role" not in d for d in ds[1:])


def test_server_histograms_agree_with_the_client(server):
    """The server times a request from its arrival in the front to the engine's token
    timestamps; the client from sending to reading. The server's figures can only be
    smaller, by the HTTP path's overhead, which a loaded machine stretches without bound
    (1.8 s of 1.9 s once): no upper bound on the difference is asserted."""
    reqs = [(i, {"model": "default", "prompt": f"{PROMPT}{i}", "max_tokens": 16,
                 "temperature": 0, "ignore_eos": True, "stream": True,
                 "stream_options": {"include_usage": True}}, None) for i in range(24)]
    before = metrics(server.url)
    outcomes, load = run_load(Job(server.url, "/v1/completions", {}, reqs, [0.0] * 24, 24))
    after = metrics(server.url)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    recs = [o.record for o in outcomes]
    assert all(o.error is None for o in outcomes) and load.chunks > 0
    client = {"ttft": sum(r["ttft"] for r in recs) / 24, "e2e": sum(r["e2e"] for r in recs) / 24,
              "tpot": sum(r["tpot"] for r in recs) / 24}
    name = "vllm:{}_seconds_{}"
    server_ = {k: d[name.format(m, "sum")] / d[name.format(m, "count")]
               for k, m in (("ttft", "time_to_first_token"), ("e2e", "e2e_request_latency"),
                            ("tpot", "request_time_per_output_token"))}
    assert d[name.format("time_to_first_token", "count")] == 24
    assert d["vllm:request_generation_tokens_sum"] == 24 * 16
    assert d[name.format("inter_token_latency", "count")] == 24 * 15
    for k in ("ttft", "e2e"):
        assert 0 < server_[k] <= client[k] + 0.005, (k, server_, client)
    # a request's 15 gaps fit between its first token and its finish
    assert 0 < 15 * server_["tpot"] <= server_["e2e"] - server_["ttft"] + 1e-6, server_


def test_finished_requests_send_the_engine_no_abort(server, loop, monkeypatch):
    """An engine request's handle cancels the request when it is collected unfinished. The
    server drops the handles of ended requests (streamed, not streamed, and one whose
    client left, which the server cancels itself): none may cost the engine an Abort."""
    dropped, cancel = [], loop._cancel_dropped
    monkeypatch.setattr(loop, "_cancel_dropped", lambda rid: (dropped.append(rid), cancel(rid)))
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for stream in (True, False):
            assert http.post("/v1/completions", json=dict(body, stream=stream)).status_code == 200
        with http.stream("POST", "/v1/completions",
                         json=dict(body, max_tokens=900, stream=True)) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
    drain, deadline = server.app.state.serve.drain, time.monotonic() + 30
    while not all(g.done for g in list(drain.open)):      # the server saw the client leave
        assert time.monotonic() < deadline, "the left request was never ended"
        time.sleep(0.05)
    gc.collect()
    assert dropped == []


def test_every_chunk_and_the_usage_chunk_carry_the_response_s_created(monkeypatch):
    """vLLM stamps a response once: each chunk, the usage chunk and the JSON response
    carry the request's `created`. The usage chunk read the clock at the stream's end (a
    second or more after its first chunk on a long stream)."""
    clock = iter([CREATED, CREATED + 90])
    monkeypatch.setattr(formats.time, "time", lambda: next(clock))
    f = formats.CompletionFormat(SimpleNamespace(num_logprobs=None, num_candidates=1,
                                                 return_tokens_as_token_ids=False),
                                 "cmpl-x", "m", None)
    assert f.created == CREATED
    assert json.loads(f.usage_chunk(usage(1, 1))[6:])["created"] == CREATED

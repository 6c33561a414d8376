"""`roseplay serve` with the official openai client on the bundled model (CPU, 127.0.0.1):
greedy parity with LLM.generate, streaming, chat template, n/seed, 200 concurrent
streams with nothing leaked, /metrics parsed and matched against the engine snapshot."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import LLM, SamplingParams
from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

PROMPTS = ["ROMEO.\nWhat news from the court?\n\nJULIET.\n",
           "First Citizen:\nBefore we proceed any further, hear me speak.",
           "The quality of mercy is not strained;"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def loop():
    """The engine in its own process, as `roseplay serve` runs it (tests/roseplay/serve/test_serve_errors.py
    keeps the in-process EngineLoop as the comparison)."""
    loop = EngineClient(device="cpu")
    yield loop
    loop.close()
    assert loop.proc.poll() is not None          # the engine process is gone


@pytest.fixture(scope="module")
def server(loop):
    srv = ServerThread(build_app(loop, ServeConfig())).start()
    assert srv.host == "127.0.0.1"
    yield srv
    srv.stop()
    assert not srv._thread.is_alive() and srv._sock.fileno() == -1   # thread and socket gone


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu")


def greedy(llm, prompts, max_tokens=MAX_TOKENS) -> list[str]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [o.outputs[0].text for o in outs]


def wait_idle(loop, timeout=20.0):
    """Until the snapshot shows no live request and no block in use (after a barrier: the
    engine process's published snapshot can be older than the last request)."""
    assert loop.wait_idle(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = loop.snapshot()
        live = [r for r in snap.requests if r.state not in ("finished", "cancelled", "error")]
        if not live and snap.num_used == 0:
            return snap
        time.sleep(0.02)
    raise AssertionError(f"engine not idle: {len(live)} live, {snap.num_used} blocks used")


# -- parity with LLM.generate ------------------------------------------------------------
def test_completions_greedy_equals_llm_generate(client, llm):
    expected = greedy(llm, PROMPTS)
    r = client.completions.create(model="default", prompt=PROMPTS, max_tokens=MAX_TOKENS,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == expected
    assert all(c.finish_reason == "length" for c in r.choices)
    assert "token_ids" not in r.choices[0].model_extra      # vLLM's extra only when asked
    n_prompt = sum(len(llm.tokenizer.encode(p)) for p in PROMPTS)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 3 * MAX_TOKENS)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"


def test_streamed_completion_equals_llm_generate(client, llm):
    expected = greedy(llm, PROMPTS[:1])[0]
    chunks = list(client.completions.create(model="default", prompt=PROMPTS[0],
                                            max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) > 1        # really streamed, one chunk per step
    assert "".join(c.choices[0].text for c in text_chunks) == expected
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS and not chunks[-1].choices


def test_token_id_prompt_and_echo(client, llm):
    ids = llm.tokenizer.encode(PROMPTS[1])
    expected = greedy(llm, [{"prompt_token_ids": ids}])[0]
    r = client.completions.create(model="default", prompt=ids, max_tokens=MAX_TOKENS,
                                  temperature=0, echo=True)
    assert r.choices[0].text == llm.tokenizer.decode(ids) + expected
    assert r.usage.prompt_tokens == len(ids)


def test_chat_uses_the_play_template(client, llm):
    """No chat_template in the bundled tokenizer: the play template of chat.py applies."""
    question = "What news from the court?"
    ids = llm.tokenizer.encode(f"ROMEO.\n{question}\n\nJULIET.\n")
    expected = greedy(llm, [{"prompt_token_ids": ids}])[0]
    messages = [{"role": "user", "content": question}]
    r = client.chat.completions.create(model="default", messages=messages,
                                       max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids) and r.id.startswith("chatcmpl-")
    stream = client.chat.completions.create(model="default", messages=messages,
                                            max_tokens=MAX_TOKENS, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content            # the role comes with the first token
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected


def test_chat_stop_string_ends_the_turn(client, llm):
    messages = [{"role": "system", "content": "A street in Verona."},
                {"role": "user", "content": "What news from the court?"}]
    r = client.chat.completions.create(model="default", messages=messages, max_tokens=64,
                                       temperature=0, stop=["\n\n"])
    full = greedy(llm, [{"prompt_token_ids": llm.tokenizer.encode(
        "A street in Verona.\n\nROMEO.\nWhat news from the court?\n\nJULIET.\n")}], 64)[0]
    assert "\n\n" in full                   # the model would go on with the next speaker
    assert r.choices[0].message.content == full.split("\n\n")[0]
    assert r.choices[0].finish_reason == "stop"


def test_n_choices_with_seed_are_reproducible(client):
    kw = dict(model="default", prompt=PROMPTS[0], max_tokens=12, temperature=1.0, n=3, seed=7)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1          # seeds 7, 8, 9 differ
    assert a.usage.completion_tokens == 36


def test_request_ids_label_endpoint_and_user(client, loop):
    """The engine (and so the TUI) sees "chatcmpl-<user>-..." / "cmpl-..." request ids."""
    r = client.chat.completions.create(model="default", max_tokens=2, user="alice!/x",
                                       messages=[{"role": "user", "content": "Hail"}])
    assert r.id.startswith("chatcmpl-alicex-")
    def state():              # snapshots are published periodically: wait for one after the end
        view = loop.snapshot().request(r.id + "-0")
        return None if view is None else view.state
    deadline = time.monotonic() + 60
    while state() != "finished" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state() == "finished"
    assert client.completions.create(model="default", prompt="Hail", max_tokens=2).id.startswith("cmpl-")


def test_streamed_chat_with_two_choices(client):
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Who comes here?"}], n=2,
        seed=3, temperature=1.0, max_completion_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    by_index = {0: [], 1: []}
    for ch in chunks:
        for c in ch.choices:
            by_index[c.index].append(c)
    for parts in by_index.values():      # each choice: role first, then content, then finish
        assert parts[0].delta.role == "assistant" and all(p.delta.role is None for p in parts[1:])
        assert parts[-1].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_served_model_names(loop):
    app = build_app(loop, ServeConfig(served_model_name=("shakespeare", "default")))
    with ServerThread(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="-") as c:
        cards = c.models.list().data
        assert [m.id for m in cards] == ["shakespeare", "default"]
        # vLLM's card: root names the model behind every served name, parent is null
        for card in (*cards, c.models.retrieve("shakespeare")):
            assert card.model_extra["root"] == loop.info.model_name
            assert card.model_extra["parent"] is None
        for name in ("shakespeare", "default"):
            assert c.completions.create(model=name, prompt="Hail", max_tokens=2).model == name
        # `model` left out or null (vLLM's clients skip it): the first served name
        chat = {"messages": [{"role": "user", "content": "Hail"}], "max_tokens": 2}
        for path, body in (("/v1/completions", {"prompt": "Hail", "max_tokens": 2}),
                           ("/v1/chat/completions", chat),
                           ("/v1/chat/completions", {**chat, "stream": True}),
                           ("/v1/responses", {"input": "Hail", "max_output_tokens": 2}),
                           ("/v1/completions", {"model": None, "prompt": "Hail",
                                                "max_tokens": 2})):
            r = httpx.post(srv.url + path, json=body, timeout=60)
            assert r.status_code == 200, r.text
            first = json.loads(r.text.split("data: ")[1]) if body.get("stream") else r.json()
            assert first["model"] == "shakespeare", (path, r.text)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["default"]
    assert models.data[0].model_extra["max_model_len"] == 1024
    assert httpx.get(server.url + "/health").status_code == 200


# -- 200 concurrent streams ----------------------------------------------------------------
async def _stream_one(http: httpx.AsyncClient, i: int) -> dict:
    body = {"model": "default", "prompt": f"{PROMPTS[i % 3]} {i}", "max_tokens": 8,
            "temperature": 0.8, "seed": i, "stream": True, "return_token_ids": True,
            "ignore_eos": True}
    tokens, finish, done = [], None, False
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                choice = json.loads(line[6:])["choices"][0]
                tokens += choice["token_ids"]
                finish = choice["finish_reason"] or finish
    return {"tokens": tokens, "finish": finish, "done": done}


def test_200_concurrent_streams_complete_and_leak_nothing(server, loop):
    async def run():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as http:
            return await asyncio.gather(*(_stream_one(http, i) for i in range(200)))
    results = asyncio.run(run())
    bad = [r for r in results if not (r["done"] and r["finish"] == "length" and len(r["tokens"]) == 8)]
    assert not bad, bad[:3]
    snap = wait_idle(loop)
    assert snap.num_used == 0 and (snap.block_refcount == 0).all()
    assert server.app.state.serve.bridge.pending == 0     # the 429 count is back to zero
    deadline = time.monotonic() + 10        # and every connection is closed
    while server.server.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.server.server_state.connections


# -- /metrics --------------------------------------------------------------------------------
def scrape(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_bucket"):     # summed over labels
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics_parse_and_match_the_snapshot(server, client, loop):
    wait_idle(loop)
    before = scrape(server)
    r = client.completions.create(model="default", prompt=PROMPTS[2] + " again", max_tokens=10,
                                  temperature=0)
    snap = wait_idle(loop)
    c = snap.counters
    deadline = time.monotonic() + 5      # the engine's idle EngineStats follow the barrier
    while (m := scrape(server))["vllm:generation_tokens_total"] != c.generated_tokens \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == snap.num_used / snap.num_blocks
    assert m["vllm:prefix_cache_queries_total"] == c.prefix_queried_tokens
    assert m["vllm:prefix_cache_hits_total"] == c.prefix_hit_tokens
    assert m["vllm:generation_tokens_total"] == c.generated_tokens
    assert m["vllm:num_preemptions_total"] == c.preemptions
    for name in ("lifetime", "idle_before_evict", "reuse_gap"):    # vLLM's kv_block_* names
        h = getattr(snap.kv_block_metrics, name)
        assert m[f"vllm:kv_block_{name}_seconds_count"] == h.count
        assert m[f"vllm:kv_block_{name}_seconds_sum"] == h.sum
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 10
    assert m["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == r.usage.prompt_tokens
    assert m["vllm:request_success_total"] - before["vllm:request_success_total"] == 1
    for name, per_request in (("vllm:time_to_first_token_seconds", 1),
                              ("vllm:inter_token_latency_seconds", 9),
                              ("vllm:e2e_request_latency_seconds", 1)):
        assert m[name + "_count"] - before[name + "_count"] == per_request
    assert m["vllm:request_generation_tokens_sum"] - before["vllm:request_generation_tokens_sum"] == 10
    # vLLM's decode phase, first token to last: within the request's end-to-end time
    def grew(name):
        return m[name] - before[name]
    assert grew("vllm:request_decode_time_seconds_count") == 1
    assert 0 < grew("vllm:request_decode_time_seconds_sum") \
        <= grew("vllm:e2e_request_latency_seconds_sum")
    # vLLM's phases from the first scheduling, one sample per finished request: queue +
    # prefill is the engine's TTFT, prefill + decode its inference time
    for phase in ("queue", "prefill", "inference"):
        assert grew(f"vllm:request_{phase}_time_seconds_count") == 1
    assert grew("vllm:request_inference_time_seconds_sum") == pytest.approx(
        grew("vllm:request_prefill_time_seconds_sum")
        + grew("vllm:request_decode_time_seconds_sum"), abs=1e-6)
    # tokens per engine step: every step counted, prompt tokens computed + emitted
    assert m["vllm:iteration_tokens_total_count"] == c.steps
    assert m["vllm:iteration_tokens_total_sum"] == c.prefill_tokens + c.generated_tokens
    # vLLM's types, labels and buckets
    fams = {f.name: f for f in text_string_to_metric_families(
        httpx.get(server.url + "/metrics").text)}
    latency = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0",
               "20.0", "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0",
               "1920.0", "7680.0", "+Inf"]
    steps = ["1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0",
             "2048.0", "4096.0", "8192.0", "16384.0", "+Inf"]
    itl = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5",
           "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]
    tokens = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0",
              "1000.0", "+Inf"]           # vLLM's 1-2-5 up to max_model_len (1024)
    for name, bounds in (("vllm:inter_token_latency_seconds", itl),
                         ("vllm:request_time_per_output_token_seconds", itl),
                         ("vllm:request_prompt_tokens", tokens),
                         ("vllm:request_generation_tokens", tokens),
                         ("vllm:e2e_request_latency_seconds", latency),
                         ("vllm:request_queue_time_seconds", latency),
                         ("vllm:request_prefill_time_seconds", latency),
                         ("vllm:request_inference_time_seconds", latency),
                         ("vllm:request_decode_time_seconds", latency),
                         ("vllm:iteration_tokens_total", steps)):
        fam = fams[name]
        buckets = [x for x in fam.samples if x.name == name + "_bucket"]
        assert fam.type == "histogram" and [b.labels["le"] for b in buckets] == bounds
        assert {(b.labels["model_name"], b.labels["engine"]) for b in buckets} \
            == {("default", "0")}
    # the process series vLLM's /metrics carries (prometheus_client's default collectors)
    assert m["process_resident_memory_bytes"] > 0 and m["process_open_fds"] > 0
    assert m["process_cpu_seconds_total"] > 0 and m["python_info"] == 1


def test_metrics_running_gauge_during_a_stream(server, loop):
    body = {"model": "default", "prompt": PROMPTS[0], "max_tokens": 900, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()      # keep it: a dropped iterator closes the connection
        rid = json.loads(next(line for line in lines if line.startswith("data: "))[6:])["id"]
        loop.pause()                # 900 tokens finish within a second on cpu_native
        try:
            deadline = time.monotonic() + 30
            state = None            # a snapshot after its first token (the one before may
            while state != "decoding" and time.monotonic() < deadline:  # show a chunk)
                state = getattr(loop.snapshot().request(rid + "-0"), "state", None)
                time.sleep(0.01)
            assert state == "decoding"
            while (m := scrape(server))["vllm:num_requests_running"] < 1 \
                    and time.monotonic() < deadline:   # EngineStats: at most 20 Hz while busy
                time.sleep(0.01)
            assert m["vllm:num_requests_running"] >= 1 and m["vllm:kv_cache_usage_perc"] > 0
        finally:
            loop.resume()
        assert sum(1 for line in lines if line == "data: [DONE]") == 1
    wait_idle(loop)


def test_request_level_metrics_observe_each_prompt_once(server, client, loop):
    """vLLM's request_params_n, request_params_max_tokens and
    request_max_num_generation_tokens: one sample per prompt when its n choices have
    finished, a cancelled stream's included; buckets 1-2-5 up to max_model_len."""
    wait_idle(loop)
    before = scrape(server)
    client.completions.create(model="default", prompt=PROMPTS[:2], n=3, max_tokens=7,
                              temperature=0.8, seed=1, extra_body={"ignore_eos": True})
    body = {"model": "default", "prompt": PROMPTS[0], "n": 2, "max_tokens": 500,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))   # then leave
    wait_idle(loop)
    deadline = time.monotonic() + 10
    while (m := scrape(server))["vllm:request_params_n_count"] \
            - before["vllm:request_params_n_count"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)

    def grew(name):
        return m[name] - before[name]
    assert grew("vllm:request_params_n_count") == 3      # two prompts, then the stream
    assert grew("vllm:request_params_n_sum") == 3 + 3 + 2
    assert grew("vllm:request_params_max_tokens_sum") == 7 + 7 + 500
    generated = grew("vllm:request_max_num_generation_tokens_sum")
    assert grew("vllm:request_max_num_generation_tokens_count") == 3
    assert 7 + 7 + 1 <= generated < 7 + 7 + 500           # the stream was cut short
    text = httpx.get(server.url + "/metrics").text
    bounds = {s.labels["le"] for fam in text_string_to_metric_families(text)
              if fam.name == "vllm:request_params_max_tokens" for s in fam.samples
              if s.name.endswith("_bucket")}
    assert bounds == {"1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0",
                      "500.0", "1000.0", "+Inf"}       # max_model_len 1024

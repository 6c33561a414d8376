"""/metrics tells the truth on the default path: `roseplay serve`'s app on an engine in
its own process (built as serve builds it: no snapshots) shows requests running, KV
usage and generated tokens growing while 16 streams run, then the exact counts when
idle; the in-process engine, the comparison, shows the same. prompt_tokens_total counts
a prompt once however many choices (n) it has."""
import json
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.front.client import EngineClient
from engine.front.loop import EngineLoop
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread
from tests.helpers import wait_for

STREAMS = 16
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
TIMEOUT = 60


@pytest.fixture(scope="module", params=["engine-process", "in-process"])
def served(request):
    if request.param == "engine-process":     # as `roseplay serve` builds it (serve/cli.py)
        loop = EngineClient(model="default", device="cpu", label="server", snapshots=False)
    else:
        loop = EngineLoop(model="default", device="cpu")
    srv = ServerThread(build_app(loop)).start()
    yield loop, srv
    srv.stop()
    loop.close()


def scrape(srv) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_gauges_and_counters_move_under_load(served):
    loop, srv = served
    before = scrape(srv)
    started, stop = [], threading.Event()
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 900, "temperature": 0,
            "ignore_eos": True, "stream": True}

    def stream(i):
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
            assert r.status_code == 200
            for line in r.iter_lines():      # read on (a reader that stops disconnects)
                if line.startswith("data: {") and i not in started:
                    started.append(i)
                if stop.is_set():
                    break                    # leave early: the request is cancelled
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(started) == STREAMS)
        # EngineStats come at most every STATS_INTERVAL while busy: the sample after the
        # streams' first tokens may still be one from before them, so wait for it
        first = wait_for(lambda: (m := scrape(srv))["vllm:num_requests_running"] > 0 and
                         m["vllm:generation_tokens_total"] >
                         before["vllm:generation_tokens_total"] and m)
        assert first["vllm:kv_cache_usage_perc"] > 0
        assert first["vllm:num_requests_running"] + first["vllm:num_requests_waiting"] <= STREAMS
        gen0 = first["vllm:generation_tokens_total"]
        wait_for(lambda: scrape(srv)["vllm:generation_tokens_total"] > gen0 + STREAMS)
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
    idle = wait_for(lambda: (m := scrape(srv))["vllm:num_requests_running"] == 0 and
                    m["vllm:kv_cache_usage_perc"] == 0 and m)
    assert idle["vllm:num_requests_waiting"] == 0
    assert idle["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]


def test_exact_counts_when_idle_and_prompt_tokens_once_per_prompt(served):
    loop, srv = served
    before = scrape(srv)
    r = httpx.post(srv.url + "/v1/completions", timeout=TIMEOUT, json={
        "model": "default", "prompt": PROMPT + " again", "max_tokens": 10, "n": 3,
        "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    n_prompt = len(loop.inputs.process(PROMPT + " again")[0].prompt_token_ids)
    after = wait_for(lambda: (m := scrape(srv))["vllm:generation_tokens_total"] ==
                     before["vllm:generation_tokens_total"] + 30 and m)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == n_prompt
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 3
    assert json.loads(r.text)["usage"]["completion_tokens"] == 30

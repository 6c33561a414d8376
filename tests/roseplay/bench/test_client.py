"""The load client of `roseplay bench --base-url` on its own: the SSE parser (split reads,
CRLF, coalesced chunks, errors), several client processes merged into one report, and
the ceiling tool against scripts/canned_server.py (127.0.0.1, no engine). How that server
ends on signals: test_canned_server.py."""
from __future__ import annotations

import os
import sys

import pytest

from roseplay.bench.clients import ClientPool, Job, run_load, split
from roseplay.bench.sse import Outcome, SSEParser, has_output

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import client_ceiling  # noqa: E402

CHUNK = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
         b'"choices":[{"index":0,"text":"to be","logprobs":null,"finish_reason":null,'
         b'"token_ids":[11,12,13]}],"usage":null}\n\n')
USAGE = (b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":5,'
         b'"completion_tokens":3,"total_tokens":8}}\n\n')


def test_parser_reads_events_split_anywhere():
    stream = CHUNK + USAGE + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):          # every split of the bytes into two reads
        p = SSEParser()
        chunks = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert len(chunks) == 2 and p.done
        assert chunks[0].choices[0].text == "to be" and has_output(chunks[0].choices[0])
        assert chunks[1].choices == [] and chunks[1].usage.completion_tokens == 3


def test_parser_handles_crlf_comments_chat_and_errors():
    p = SSEParser()
    chat = (b': keep-alive\r\n\r\ndata: {"choices":[{"index":0,"delta":{"role":"assistant",'
            b'"content":"Hi"},"finish_reason":"stop"}]}\r\n\r\n')
    err = b'data: {"error":{"message":"boom","type":"server_error","code":500}}\n\n'
    (c,) = p.feed(chat)
    assert c.choices[0].delta.content == "Hi" and c.choices[0].finish_reason == "stop"
    (e,) = p.feed(err)
    assert e.error.message == "boom" and not p.done


def test_output_is_text_content_or_token_ids():
    p = SSEParser()
    ids_only, empty = p.feed(b'data: {"choices":[{"text":"","token_ids":[5]}]}\n\n'
                             b'data: {"choices":[{"text":"","token_ids":[ ],'
                             b'"finish_reason":"length"}]}\n\n')
    assert has_output(ids_only.choices[0]) and not has_output(empty.choices[0])


def test_split_keeps_every_request_once_and_the_concurrency_cap():
    reqs = [(i, {}, None) for i in range(10)]
    jobs = split(Job("http://x", "/v1/completions", {}, reqs, [0.0] * 10, 5), 3)
    assert sorted(i for j in jobs for i, _, _ in j.requests) == list(range(10))
    assert [j.max_concurrency for j in jobs] == [2, 2, 2]


@pytest.fixture(scope="module")
def canned():
    proc, port = client_ceiling.start_canned(workers=1, tokens_per_chunk=4)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    assert proc.wait(10) is not None


def body(n: int) -> dict:
    return {"model": "dummy:tiny", "prompt": [1, 2, 3], "max_tokens": n, "stream": True}


@pytest.mark.timeout(60)
def test_two_client_processes_share_one_report(canned):
    reqs = [(i, body(10 + i), 3) for i in range(12)]
    job = Job(canned, "/v1/completions", {}, reqs, [0.0] * 12, 12)
    seen = []
    with ClientPool(2) as pool:
        run_load(job, pool)                    # a warm-up: the same processes run again
        outcomes, load = run_load(job, pool, on_progress=seen.append)
        procs = pool._procs
    assert not any(p.is_alive() for p in procs)
    assert [o.index for o in outcomes] == list(range(12))
    assert all(o.error is None for o in outcomes)
    # 4 tokens a chunk: ceil((10 + i) / 4) chunks, the usage's tokens, from both processes
    assert [o.record["output_len"] for o in outcomes] == [10 + i for i in range(12)]
    assert [o.record["chunks"] for o in outcomes] == [-(-(10 + i) // 4) for i in range(12)]
    assert load.processes == 2 and load.chunks == sum(-(-(10 + i) // 4) for i in range(12))
    assert 0 < load.cpu_s and 0 < load.max_util <= 1.5 and seen and seen[-1] == 12
    starts = [o.record["arrival_time"] for o in outcomes]
    assert max(starts) - min(starts) < 5.0          # one clock, one start: a merged run


@pytest.mark.timeout(60)
def test_ctrl_c_keeps_what_the_client_processes_finished(canned):
    """Ctrl-C during a --num-clients 2 run: each client process sends back the requests it
    saw finish, and all end (the run reported 'nothing was measured yet', each process
    dropping its share). Requests 6..11 arrive a minute on: the interrupt comes first."""
    from roseplay.bench.clients import LoadInterrupted
    reqs = [(i, body(4), 3) for i in range(12)]
    job = Job(canned, "/v1/completions", {}, reqs, [0.0] * 6 + [60.0] * 6, 12)

    def ctrl_c(done: int):
        if done >= 6:
            raise KeyboardInterrupt

    with ClientPool(2) as pool:
        procs = pool._procs
        with pytest.raises(LoadInterrupted) as exc:
            run_load(job, pool, on_progress=ctrl_c)
    assert [o.index for o in exc.value.outcomes] == list(range(6))
    assert all(o.error is None and o.record["output_len"] == 4 for o in exc.value.outcomes)
    assert not any(p.is_alive() for p in procs)


@pytest.mark.timeout(120)
def test_ceiling_tool_reports_rates_and_client_cpu(tmp_path, capsys):
    out = tmp_path / "ceiling.json"
    assert client_ceiling.main(["--num-prompts", "16", "--output-len", "8", "--repeat", "1",
                                "--num-clients", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out      # `roseplay bench --num-clients 2` end to end
    assert "--num-clients 2:" in text and "chunks/s" in text and "cores" in text
    (row,) = __import__("json").loads(out.read_text())
    assert row["num_clients"] == 2 and row["output_tok_s"] > 0 and row["chunks_per_s"] > 0 and row["client_cores"] > 0


def test_ctrl_c_reports_the_finished_requests(tmp_path, capsys, monkeypatch):
    """Ctrl-C during an HTTP bench run: the requests that finished are reported and
    written, exit 130 (it was a KeyboardInterrupt traceback and nothing kept)."""
    import asyncio
    import json
    import signal

    from roseplay.bench import clients, http, inproc

    async def send(http_client, path, body, index, prompt_len):
        if index == 3:                      # Ctrl-C while request 3 is in flight
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(60)
        t = 100.0 + index
        return Outcome(index, {"prompt_len": 8, "output_len": 2, "ttft": 0.01, "tpot": 0.01,
                               "e2e": 0.02, "itls": [0.01], "arrival_time": t,
                               "last_token_time": t + 0.02})

    monkeypatch.setattr(clients, "send", send)
    monkeypatch.setattr(http, "served_models", lambda url, headers: {"dummy:tiny": 2048})
    monkeypatch.setattr(http, "reset_prefix_cache", lambda url, headers: True)
    monkeypatch.setattr(http, "scrape_counters", lambda url, headers: {})
    monkeypatch.setattr(http.replicas, "scrape", lambda url, headers: None)
    path = tmp_path / "int.json"
    rc = inproc.main(["--base-url", "http://127.0.0.1:9", "--model", "dummy:tiny",
                      "--num-prompts", "6", "--input-len", "8", "--output-len", "2",
                      "--max-concurrency", "1", "--warmup", "0", "--no-progress",
                      "--json", str(path), "--goodput", "ttft:100"])
    out = capsys.readouterr().out
    assert rc == 130 and "interrupted after" in out and "(interrupted)" in out
    assert "Request goodput (req/s):" in out          # the SLOs asked for, kept
    data = json.loads(path.read_text())
    assert data["mode"] == "interrupted" and data["summary"]["successful_requests"] == 3
    assert data["summary"]["good_requests"] == 3
    assert data["completed"] == 3 and data["backend"] == "openai"   # vLLM's fields too


def test_a_server_refusing_the_models_call_is_one_line(capsys, monkeypatch):
    """An HTTP error before the run (a server without /v1/models: 404) is one line on
    stderr, exit 2 (httpx's message ends with a second line, a link)."""
    import httpx

    from roseplay.bench import http, inproc

    def served_models(url, headers):
        request = httpx.Request("GET", url + "/v1/models")
        raise httpx.HTTPStatusError("Client error '404 Not Found'\nFor more information "
                                    "check: https://example", request=request,
                                    response=httpx.Response(404, request=request))

    monkeypatch.setattr(http, "served_models", served_models)
    rc = inproc.main(["--base-url", "http://127.0.0.1:9/v1", "--model", "dummy:tiny",
                      "--num-prompts", "2", "--warmup", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "404 Not Found" in err, err


def test_base_url_ending_in_v1_and_a_model_not_served(capsys, monkeypatch):
    """--base-url as OpenAI clients write it (…/v1) names the server's root (the bench
    asked for /v1/v1/models); a --model the server does not serve is one line, exit 2,
    before any request (each request's 404 made a failed run). --seed, the workload's,
    is taken with --base-url."""
    from roseplay.bench import http, inproc
    asked = []
    monkeypatch.setattr(http, "served_models", lambda url, headers: asked.append(url) or
                        {"default": None})
    rc = inproc.main(["--base-url", "http://127.0.0.1:9/v1/", "--model", "dummy:tiny",
                      "--seed", "3", "--num-prompts", "2", "--warmup", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert asked == ["http://127.0.0.1:9"]
    assert rc == 2 and err.count("\n") == 1, err
    assert err == ("roseplay bench: error: --model dummy:tiny: not served at "
                   "http://127.0.0.1:9 (it serves: default) (see roseplay bench --help)\n")


def test_chat_on_a_model_without_a_tokenizer_names_the_flag(capsys, monkeypatch):
    """--endpoint chat on a dummy model (token ids, no text): the flag is named, as other
    flag errors are (it read 'http://...: ValueError: chat needs text prompts')."""
    from roseplay.bench import http, inproc
    monkeypatch.setattr(http, "served_models", lambda url, headers: {"dummy:tiny": 2048})
    rc = inproc.main(["--base-url", "http://127.0.0.1:9", "--model", "dummy:tiny",
                      "--endpoint", "chat", "--num-prompts", "2", "--warmup", "0",
                      "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("roseplay bench: error: --endpoint chat needs text prompts: "
                               "dummy:tiny has no tokenizer (use --endpoint completions) "
                               "(see roseplay bench --help)\n"), err


@pytest.mark.parametrize("argv, refused", [
    (["--input-len", "2040", "--output-len", "16"], True),      # 2056 > 2048
    (["--input-len", "2032", "--output-len", "16"], False),     # 2048: it fits
    (["--input-len", "4000", "--range-ratio", "0.5"], False),   # from 2000 + 32: some fit
    (["--input-len", "4000", "--scenario", "shared-prefix"], False),   # its own lengths
])
def test_a_workload_the_server_refuses_whole_is_refused_before_it_runs(argv, refused, capsys,
                                                                        monkeypatch):
    """The server's max_model_len (its /v1/models card, vLLM's field) against the random
    scenario's shortest prompt + max_tokens: every request would be a 400 (the run printed
    0.00 everywhere), so the bench says which flags, exit 2, before any request."""
    from roseplay.bench import clients, http, inproc
    sent = []

    async def send(http_client, path, body, index, prompt_len):
        sent.append(index)
        return Outcome(index, None, "HTTP 400")

    monkeypatch.setattr(clients, "send", send)
    monkeypatch.setattr(http, "served_models", lambda url, headers: {"dummy:tiny": 2048})
    monkeypatch.setattr(http, "reset_prefix_cache", lambda url, headers: True)
    monkeypatch.setattr(http, "scrape_counters", lambda url, headers: {})
    monkeypatch.setattr(http.replicas, "scrape", lambda url, headers: {"engines": {}, "routing": None})
    rc = inproc.main(["--base-url", "http://127.0.0.1:9", "--model", "dummy:tiny",
                      "--output-len", "32", "--num-prompts", "2", "--warmup", "0",
                      "--no-progress", *argv])
    err = capsys.readouterr().err
    if refused:
        assert rc == 2 and sent == [] and err == (
            "roseplay bench: error: --input-len 2040 --output-len 16: every request asks for "
            "2056 tokens or more (prompt + max_tokens) and the server's max_model_len is "
            "2048, so it would refuse every request; ask for 2048 or fewer (see roseplay "
            "bench --help)\n"), err
    else:
        assert sent == [0, 1] and rc == 1        # sent, each failed (the stub's 400)

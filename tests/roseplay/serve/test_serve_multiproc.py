"""`roseplay serve --api-server-count 2` as a real subprocess (engine in its own process,
two API-server processes on one 127.0.0.1 port): concurrent streams give the solo greedy
tokens, both processes serve, /metrics sums both processes' counts whichever answers the
scrape, /reset_prefix_cache clears the engine's prefix cache (and wants the API key),
SIGTERM drains every process (exit 0), and an API-server process killed with SIGKILL
stops the group (exit 5). Each server check ends with nothing left: no process, port,
engine socket dir or metrics dir."""
from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from roseplay.serve.multiproc import EXIT_API_SERVER_DIED
from tests.roseplay.serve.group_proc import GroupProc, cmdline, per_server, scrape, total
from tests.roseplay.serve.serve_proc import PROMPT, free_port
from tests.roseplay.serve.open_streams import assert_sigterm_drains_open_streams, open_streams, solo_tokens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
MAX_TOKENS = 24
STREAMS = 8
API_KEY = "test-key-1"


def complete(url: str, prompt: str = PROMPT, max_tokens: int = 2, **kw) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    with httpx.Client(timeout=60) as c:       # a new connection: the kernel picks a process
        return c.post(url + "/v1/completions", json=body, **kw)


@pytest.fixture(scope="module")
def group():
    with GroupProc("--shutdown-timeout", "60") as srv:
        yield srv


def test_concurrent_streams_match_a_solo_run(group):
    ref = solo_tokens(group.url, MAX_TOKENS)
    readers = open_streams(group.url, STREAMS, MAX_TOKENS)
    for r in readers:
        ids, errors, reasons, done = r.result()
        assert errors == [] and reasons == ["length"] and done
        assert ids == ref


def test_both_processes_serve_and_metrics_add_up(group):
    before = scrape(group.url)
    sent, served = 0, {}
    while sent < 64 and not (len(served) == 2 and min(served.values()) > 0):
        assert complete(group.url).status_code == 200
        sent += 1
        served = per_server(scrape(group.url))
    assert set(served) == {"0", "1"} and min(served.values()) > 0, served
    for _ in range(4):           # whichever process answers the scrape: the same sums
        after = scrape(group.url)
        done = total(after, "vllm:request_success_total") - \
            total(before, "vllm:request_success_total")
        assert done == sent
        assert sum(per_server(after).values()) == total(after, "vllm:request_success_total")
        assert total(after, "vllm:e2e_request_latency_seconds_count") == \
            total(after, "vllm:request_success_total")


QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def _after_request(url: str, prompt: str) -> tuple[float, float]:
    """(queries, hits) once the engine's stats cover one more request: its counters come
    with its stats messages, a little after the response."""
    queries = total(scrape(url), QUERIES)
    assert complete(url, prompt).status_code == 200
    done = threading.Event()
    for _ in range(200):
        now = scrape(url)
        if total(now, QUERIES) > queries:
            return total(now, QUERIES), total(now, HITS)
        done.wait(0.05)
    raise AssertionError("the engine's stats did not move")


def test_reset_prefix_cache_clears_the_engine_cache(group):
    prompt = PROMPT * 8                       # several KV blocks of prompt
    _, hits = _after_request(group.url, prompt)
    _, hits2 = _after_request(group.url, prompt)        # a repeat hits the cache
    assert hits2 > hits
    assert httpx.post(group.url + "/reset_prefix_cache", timeout=10).status_code == 200
    _, hits3 = _after_request(group.url, prompt)        # cold again: no new hits
    assert hits3 == hits2


def test_bench_repeats_start_with_a_cold_prefix_cache(group, tmp_path, capsys):
    """bench --base-url clears the server's prefix cache before each run: the second run
    of the same prompts finds none of the first's (without the reset it would hit them
    all)."""
    from roseplay.bench import inproc as bench
    path = tmp_path / "out.json"
    rc = bench.main(["--base-url", group.url, "--scenario", "random", "--num-prompts", "4",
                     "--input-len", "64", "--output-len", "2", "--warmup", "0", "--repeat",
                     "2", "--no-progress", "--json", str(path)])
    assert rc == 0, capsys.readouterr().out
    delta = json.loads(path.read_text())["server_metrics_delta"]      # the last run's
    assert delta[QUERIES] >= 4 * 48 and delta[HITS] == 0, delta


def test_sigterm_drains_every_process_and_exits_0(group):
    """Last on the module's server: streams of both processes finish in the drain."""
    assert_sigterm_drains_open_streams(group, STREAMS, MAX_TOKENS)
    group.assert_clean()


def test_api_key_and_a_killed_api_server_stops_the_group():
    with GroupProc("--api-key", API_KEY, "--shutdown-timeout", "5") as srv:
        assert API_KEY not in cmdline(srv.api_pids[0])
        assert httpx.post(srv.url + "/reset_prefix_cache", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        for _ in range(4):          # both processes hold the key
            assert httpx.post(srv.url + "/reset_prefix_cache", headers=auth,
                              timeout=10).status_code == 200
            assert complete(srv.url, headers=auth).status_code == 200
        os.kill(srv.api_pids[0], signal.SIGKILL)
        assert srv.wait(60) == EXIT_API_SERVER_DIED, srv.output
        assert "API-server process died" in srv.output


def test_count_refused_with_in_process_and_tui():
    from roseplay.serve.cli import main
    for flag in ("--in-process", "--tui"):
        with pytest.raises(SystemExit) as exc:
            main(["--api-server-count", "2", flag, "--port", str(free_port())])
        assert exc.value.code == 2

"""Data parallelism on the CPU: two engine processes behind one front (LLM with
data_parallel_size=2, its DPClient). Greedy tokens through the router equal one engine's;
cache_aware sends a prefix to the replica whose KV events say it holds it; a replica
killed mid-load fails only its own requests and new ones go to the other. One pair of
processes serves the module (the kill comes last); the server's and the bench's data
parallel paths run on it too."""
import os
import signal

import pytest

from engine import LLM, SamplingParams
from engine.config import InvalidRequestError
from engine.front.dp_client import DPClient
from engine.front.router import ReplicaLoad
from tests.helpers import engines_owned_by, wait_for

KW = dict(model="dummy:tiny", device="cpu", num_blocks=2048, block_size=4, seed=0)
PROMPTS = [[(7 * i + j) % 500 + 1 for j in range(5 + 3 * i)] for i in range(6)]


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    llm = LLM(**KW, data_parallel_size=2, routing_policy="round_robin")
    yield llm
    llm.close()
    assert not engines_owned_by(os.getpid()), "engine process left behind"


def test_greedy_tokens_through_the_router_equal_one_engines(llm):
    with LLM(**KW) as one:
        ref = one.generate(PROMPTS, greedy(12))
    out = llm.generate(PROMPTS, greedy(12))
    assert [o.outputs[0].token_ids for o in out] == [r.outputs[0].token_ids for r in ref]
    assert llm.dp.router.routed == [3, 3]          # round robin: both replicas served


def test_replicas_sample_apart(llm):
    """Unseeded samples of one prompt on two replicas differ: each replica's sampler is
    seeded with seed + its rank (both drew the same noise in lockstep: n=2 gave one text
    twice). Seeded requests draw alike wherever they run."""
    dp = llm.dp
    sampled = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    one, two = (dp.submit(PROMPTS[1], sampled, data_parallel_rank=r).result(60)
                for r in (0, 1))
    assert one.outputs[0].token_ids != two.outputs[0].token_ids
    seeded = sampled.replace(seed=9)
    one, two = (dp.submit(PROMPTS[1], seeded, data_parallel_rank=r).result(60)
                for r in (0, 1))
    assert one.outputs[0].token_ids == two.outputs[0].token_ids


def test_a_streams_cancel_is_the_callers_cancel(llm):
    """A routed stream's cancel() ends its request on its replica as dp.cancel does
    (cancelled, no error: it read as a dropped stream's)."""
    dp = llm.dp
    dp.pause()
    try:
        stream = dp.submit(PROMPTS[0], greedy(8))
        stream.cancel()
    finally:
        dp.resume()
    out = stream.result(60)
    assert out.outputs[0].finish_reason == "cancelled" and out.error is None


def test_cache_aware_follows_the_replicas_caches(llm):
    dp = llm.dp
    dp.set_routing_policy("cache_aware")
    assert dp.wait_idle(60)
    seqs = [st.kv_events_seq for st in dp.replica_stats()]
    dp.reset_prefix_cache()                 # while idle: its batch is waited for too
    assert dp.wait_idle(60)
    assert [st.kv_events_seq for st in dp.replica_stats()] == [s + 1 for s in seqs]
    assert not any(c.hashes for c in dp.kv_index.caches)
    a, b = list(range(1, 33)), list(range(101, 133))       # 8 blocks each
    dp.submit(a + [1], greedy(2), data_parallel_rank=1).result(60)   # a lives on 1
    dp.submit(b + [1], greedy(2), data_parallel_rank=0).result(60)   # b lives on 0
    for i in range(3):
        for prefix, home in ((a, 1), (b, 0)):
            assert dp.wait_idle(60)            # the index holds both replicas' events
            out = dp.submit(prefix + [200 + i, 300 + i], greedy(2)).result(60)
            d = dp.router.recent[-1]
            assert d.chosen == home and d.cached_blocks[home] == 8, d
            assert out.metrics.num_cached_tokens == 32     # the engine hit it there
    dp.set_routing_policy("round_robin")
    chosen = [dp.router.choose(f"x{i}", a, dp.loads()).chosen for i in range(4)]
    assert sorted(chosen) == [0, 0, 1, 1]                    # blind to the cache


def test_the_server_pins_routes_switches_and_labels_replicas(llm):
    """`roseplay serve --data-parallel-size 2`'s app on the same front: a request pinned by
    the data_parallel_rank extra field, GET/POST /routing, /metrics per engine."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    from roseplay.serve.app import build_app
    from roseplay.serve.server import ServerThread
    body = {"model": "dummy:tiny", "prompt": PROMPTS[1], "max_tokens": 3, "temperature": 0}
    with ServerThread(build_app(llm.dp)) as srv:
        for rank in (1, 0, 1):
            r = httpx.post(srv.url + "/v1/completions", json={**body, "data_parallel_rank": rank})
            assert r.status_code == 200, r.text
            assert llm.dp.router.recent[-1].chosen == rank
        bad = httpx.post(srv.url + "/v1/completions", json={**body, "data_parallel_rank": 2})
        assert bad.status_code == 400 and "data_parallel_rank" in bad.text
        state = httpx.post(srv.url + "/routing", json={"policy": "least_load"}).json()
        assert state["policy"] == "least_load" == llm.dp.router.policy
        assert [r["alive"] for r in state["replicas"]] == [True, True]
        assert [r["host_cached_blocks"] for r in state["replicas"]] == [0, 0]   # no host tier
        assert httpx.post(srv.url + "/routing", json={"policy": "x"}).status_code == 400
        served = {}
        for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
            for s in fam.samples:
                if s.name == "vllm:request_success_total" and s.value:
                    served[s.labels["engine"]] = served.get(s.labels["engine"], 0) + s.value
                if s.name == "vllm:num_requests_running":
                    assert s.labels["engine"] in ("0", "1")
        assert served == {"0": 1, "1": 2}


def test_bench_reports_each_replica(llm):
    """`roseplay bench --data-parallel-size 2`'s measured run on the same front: the
    merged engine figures and one row per replica."""
    import argparse
    from roseplay.bench import inproc as bench
    from roseplay.bench.args import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "dummy:tiny", "--scenario", "shared-prefix",
                              "--num-prompts", "16", "--output-len", "4"])
    llm.dp.set_routing_policy("round_robin")
    items, _ = bench._workload(llm.dp, args)
    result, outputs = bench.measure(llm.dp, items, [], args, "dp")
    figures = result.engine["data_parallel"]
    assert figures["routing_policy"] == "round_robin" and figures["imbalance"] == 1.0
    assert [row["requests"] for row in figures["replicas"]] == [8, 8]
    assert sum(row["output_tokens"] for row in figures["replicas"]) == 16 * 4
    assert result.engine["num_blocks"] == 2 * KW["num_blocks"] and result.failed == 0


def test_bench_base_url_reports_each_replica(llm, tmp_path):
    """`roseplay bench --base-url` against the data-parallel server: one row per replica
    from the server's /metrics (label engine) and /routing, read before and after the
    run (the warm-up's requests are not counted), in the report and in --json."""
    import argparse
    import io
    import json

    from rich.console import Console

    from roseplay.bench import http as bench_http
    from roseplay.bench.args import add_arguments
    from roseplay.serve.app import build_app
    from roseplay.serve.server import ServerThread
    llm.dp.set_routing_policy("round_robin")
    with ServerThread(build_app(llm.dp)) as srv:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--base-url", srv.url, "--model", "dummy:tiny",
                                  "--num-prompts", "8", "--output-len", "4", "--warmup", "2",
                                  "--json", str(tmp_path / "b.json")])
        out = io.StringIO()
        assert bench_http.run(args, Console(file=out, width=120)) == 0, out.getvalue()
    figures = json.loads((tmp_path / "b.json").read_text())["data_parallel"]
    assert figures["routing_policy"] == "round_robin" and figures["imbalance"] == 1.0
    rows = figures["replicas"]
    assert [(r["engine"], r["requests"], r["routed"]) for r in rows] == [(0, 4, 4), (1, 4, 4)]
    assert [r["output_tokens"] for r in rows] == [16, 16] and all(r["alive"] for r in rows)
    assert all(r["ttft_p50_ms"] > 0 for r in rows)
    assert "Replicas (round_robin)" in out.getvalue()


def test_an_invalid_grammar_is_refused_before_it_is_routed(llm):
    """The front's grammar check (engine/grammars.py) runs before the router: nothing
    is routed or sent, and the next request is served."""
    dp = llm.dp
    routed = list(dp.router.routed)
    bad = SamplingParams(max_tokens=4, structured_outputs={"regex": "("})
    with pytest.raises(InvalidRequestError, match="structured_outputs.regex is invalid"):
        dp.submit(PROMPTS[0], bad)
    assert dp.router.routed == routed
    assert dp.submit(PROMPTS[0], greedy(2)).result(60).error is None


def test_a_given_data_parallel_rank_is_refused_before_any_start():
    """The front numbers the replicas it starts; a given rank was dropped unsaid."""
    with pytest.raises(InvalidRequestError, match="data_parallel_rank 1: the front gives"):
        DPClient(**KW, data_parallel_size=2, data_parallel_rank=1)


def test_a_given_kv_events_config_is_kept_when_turned_on():
    """Data parallelism turns the events on; the rest of a given config (a topic, say,
    that an outside consumer subscribes to) is kept, and the router reads them there.
    A wildcard port (tcp://H:*) is each replica's own (replica 1 died making PORT+1)."""
    with DPClient(**KW, data_parallel_size=2, routing_policy="cache_aware",
                  kv_events_config={"topic": "kv", "publisher": "null",
                                    "endpoint": "tcp://127.0.0.1:*",
                                    "replay_endpoint": "tcp://127.0.0.1:*"}) as dp:
        events = [c.transport.kv_events for c in dp.replicas]
        assert [e.topic for e in events] == ["kv", "kv"]
        assert len({e.endpoint for e in events} | {e.replay_endpoint for e in events}) == 4
        assert all(not e.endpoint.endswith(":*") for e in events)
        a = list(range(1, 33))
        dp.submit(a + [1], greedy(2), data_parallel_rank=1).result(60)
        assert dp.wait_idle(60)
        dp.submit(a + [2], greedy(2)).result(60)
        d = dp.router.recent[-1]
        assert d.chosen == 1 and d.cached_blocks[1] == 8, d


def kill_replica_1(dp, kill, doomed_prompts, kept_prompts, kept_tokens: int, error: str,
                   timeout: float) -> None:
    """Replica 1's requests (long) and replica 0's (short), all running; kill() ends
    replica 1: its requests end with an error saying `error`, replica 0's finish whole.
    (tests/engine/front/test_dp_attach.py runs it over attached engines.)"""
    doomed = [dp.submit(p, greedy(1500), data_parallel_rank=1) for p in doomed_prompts]
    kept = [dp.submit(p, greedy(kept_tokens), data_parallel_rank=0) for p in kept_prompts]
    for s in doomed + kept:                          # every request is running
        assert s.get(60).token_ids
    kill()
    for s in doomed:
        out = s.result(timeout)
        assert out.outputs[0].finish_reason == "error" and error in out.error
        assert len(out.outputs[0].token_ids) < 1500
    for s in kept:
        out = s.result(timeout)
        assert out.outputs[0].finish_reason == "length" and out.error is None
        assert len(out.outputs[0].token_ids) == kept_tokens


def every_policy_routes_to_0(dp) -> None:
    """With replica 1 dead, every routing policy sends a new request to replica 0."""
    for policy in ("round_robin", "least_load", "consistent_hash", "cache_aware"):
        dp.set_routing_policy(policy)
        out = dp.submit(PROMPTS[0], greedy(4)).result(60)
        assert out.error is None and dp.router.recent[-1].chosen == 0


def test_a_killed_replica_fails_only_its_requests(llm):
    dp = llm.dp

    def kill():     # once replica 1's stats say its 3 requests run (its load as it dies)
        wait_for(lambda: dp.replica_stats()[1].num_running == 3)
        os.kill(dp.replicas[1].proc.pid, signal.SIGKILL)
    kill_replica_1(dp, kill, PROMPTS[:3], PROMPTS[3:], 300, "died", 60)
    wait_for(lambda: not dp.alive(1))
    assert dp.fatal_error is None and dp.unavailable is None
    every_policy_routes_to_0(dp)
    dead = dp.replica_stats()[1]       # holds nothing now; its counters stay
    assert (dead.num_running, dead.num_waiting, dead.num_used_blocks) == (0, 0, 0)
    assert dead.generation_tokens > 0
    assert dp.loads()[1] == ReplicaLoad(0, 0, 0, alive=False)

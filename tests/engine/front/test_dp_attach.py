"""A data-parallel front attached by address to engines that run elsewhere
(DPClient(engine_addresses=[...]), docs/ROUTING.md "Replicas on other hosts"): two engine
processes on 127.0.0.1 tcp ports, KV events on, one key, shared by the module. Greedy
tokens through the attached front equal one engine's; cache_aware follows the attached
engines' events; closing the front leaves the engines serving (a new front attaches
again); replicas without KV events or that differ are refused; a killed engine fails
only its own requests (last: it kills one of them)."""
import collections
import os
import signal
import time
import types

import pytest

from engine.config import InvalidRequestError
from engine.engine_stats import EngineStats
from engine.front.dp_attach import check_replicas, front_config
from engine.front.client import EngineClient
from engine.front.dp_client import DPClient
from engine.ipc import protocol as P
from engine.ipc.launch import EngineLaunch, wait_ready
from tests.engine.front.test_data_parallel import (PROMPTS, every_policy_routes_to_0, greedy,
                                                   kill_replica_1)
from tests.helpers import engines_owned_by, free_port_block

KEY = "dp-attach-test-key"
KW = dict(model="dummy:tiny", device="cpu", num_blocks=2048, block_size=4, seed=0)
EVENTS = {"enable_kv_cache_events": True}
CLIENT_TIMEOUT = 4.0      # how soon an attached front judges a killed engine gone
EV = P.KVEventsEndpoints("tcp://127.0.0.1:1", None, "")     # a replica's, for the checks


@pytest.fixture(scope="module")
def engines():
    """Two engines with KV events on, loading at once."""
    kwargs = {**KW, "kv_events_config": EVENTS, "client_timeout": CLIENT_TIMEOUT}
    launches = []
    try:
        for _ in range(2):
            launches.append(EngineLaunch(kwargs, f"tcp://127.0.0.1:{free_port_block()}", KEY))
        for launch in launches:
            wait_ready(launch.proc, launch.status, None, 300)
        yield launches
    finally:
        for launch in launches:
            launch.abort()
        assert not engines_owned_by(os.getpid()), "engine process left behind"


@pytest.fixture(scope="module")
def dp(engines):
    front = DPClient(engine_addresses=[e.address for e in engines], engine_key=KEY,
                     routing_policy="round_robin")
    yield front
    front.close()


def test_greedy_tokens_through_attached_replicas_equal_one_engines(dp, engines):
    assert [c.proc for c in dp.replicas] == [None, None]        # attached, not started
    assert [c.address for c in dp.replicas] == [e.address for e in engines]
    with EngineClient(connect=engines[0].address, engine_key=KEY) as one:   # no front
        ref = [one.submit(p, greedy(12)).result(60) for p in PROMPTS]
    out = [dp.submit(p, greedy(12)).result(60) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in out] == [r.outputs[0].token_ids for r in ref]
    assert dp.router.routed == [3, 3]                 # round robin: both engines served


def test_cache_aware_reads_the_attached_engines_events(dp, engines):
    assert dp.wait_idle(60)
    dp.reset_prefix_cache()
    assert dp.wait_idle(60)
    assert not any(c.hashes for c in dp.kv_index.caches)
    dp.set_routing_policy("cache_aware")
    a, b = list(range(1, 33)), list(range(101, 133))       # 8 blocks each
    dp.submit(a + [1], greedy(2), data_parallel_rank=1).result(60)   # a lives on 1
    dp.submit(b + [1], greedy(2), data_parallel_rank=0).result(60)   # b lives on 0
    for i in range(2):
        for prefix, home in ((a, 1), (b, 0)):
            assert dp.wait_idle(60)
            out = dp.submit(prefix + [200 + i, 300 + i], greedy(2)).result(60)
            d = dp.router.recent[-1]
            assert d.chosen == home and d.cached_blocks[home] == 8, d
            assert out.metrics.num_cached_tokens == 32
    dp.set_routing_policy("round_robin")


def test_closing_a_front_leaves_the_engines_serving(engines):
    addresses = [e.address for e in engines]
    for _ in range(2):              # a closed front's engines take the next one
        with DPClient(engine_addresses=addresses, engine_key=KEY) as front:
            for rank in (0, 1):
                out = front.submit(PROMPTS[0], greedy(3), data_parallel_rank=rank).result(60)
                assert out.error is None and len(out.outputs[0].token_ids) == 3
        assert all(e.proc.poll() is None for e in engines)


def test_bench_attaches_by_address(engines):
    """`roseplay bench --engine-address A --engine-address B`: a measured run over the
    attached engines, one row per replica."""
    import argparse
    from roseplay.bench import inproc as bench
    from roseplay.bench.args import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--engine-address", engines[0].address, "--engine-address",
                              engines[1].address, "--engine-key", KEY, "--routing-policy",
                              "round_robin", "--num-prompts", "8", "--output-len", "4"])
    loop = bench.make_loop(args)
    try:
        assert isinstance(loop, DPClient) and [c.proc for c in loop.replicas] == [None, None]
        items, _ = bench._workload(loop, args)
        result, _ = bench.measure(loop, items, [], args, "dp")
    finally:
        loop.close()
    assert [row["requests"] for row in result.engine["data_parallel"]["replicas"]] == [4, 4]
    assert result.failed == 0 and all(e.proc.poll() is None for e in engines)


def test_the_app_connects_to_several_engines_as_one_front(engines, monkeypatch):
    """`roseplay --connect A --connect B --routing-policy cache_aware`: the app's engine is
    a data-parallel front over them (its replica views are DPClient's)."""
    from roseplay.workload.source import make_engine
    monkeypatch.setenv("ROSEPLAY_ENGINE_KEY", KEY)      # what --engine-key sets
    loop = make_engine({"model": "default", "routing_policy": "cache_aware"},
                       [e.address for e in engines])
    try:
        assert isinstance(loop, DPClient) and loop.router.policy == "cache_aware"
        assert len(loop.replica_snapshots()) == 2
    finally:
        loop.close()
    assert all(e.proc.poll() is None for e in engines)


def replica(address, events=EV, **info):
    """A replica for check_replicas: its address, its Welcome's info and events."""
    fields = {"model_name": "m", "block_size": 4, "vocab_size": 512, "max_model_len": 256,
              "structured_outputs_backend": "auto", "logprobs_mode": "processed_logprobs",
              "default_sampling_params": {}, "override_max_tokens": None, **info}
    return types.SimpleNamespace(address=address, info=types.SimpleNamespace(**fields),
                                 transport=types.SimpleNamespace(kv_events=events))


def test_replicas_must_publish_events_and_serve_one_model_in_one_block_size():
    """(A real engine without events: tests/roseplay/serve/test_serve_dp_attach.py.)"""
    check_replicas([replica("a"), replica("b")])
    with pytest.raises(InvalidRequestError, match="engine at b publishes no KV events.*"
                                                  "--kv-events-config"):
        check_replicas([replica("a"), replica("b", None)])
    for field, value in (("model_name", "other"), ("block_size", 16), ("vocab_size", 7)):
        with pytest.raises(InvalidRequestError, match=f"{field} is .* at a and .* at b"):
            check_replicas([replica("a"), replica("b", **{field: value})])


@pytest.mark.parametrize("field, value", [
    ("max_model_len", 128), ("structured_outputs_backend", "xgrammar"), ("logprobs_mode", "raw_logprobs"),
    ("default_sampling_params", {"temperature": 0.6}), ("override_max_tokens", 64)])
def test_replicas_must_answer_a_request_alike(field, value):
    """The front checks requests and fills their defaults with replica 0's info: another
    replica's grammar library, logprobs or generation-config defaults would make the answer
    depend on the route."""
    check_replicas([replica("a"), replica("b")])
    with pytest.raises(InvalidRequestError) as e:
        check_replicas([replica("a"), replica("b", **{field: value})])
    default = replica("a").info.__dict__[field]
    assert "\n" not in str(e.value)
    assert f"{field} is {default!r} at a and {value!r} at b" in str(e.value)


def test_an_engine_that_would_answer_otherwise_is_refused_and_left_serving(engines):
    """Its Welcome's info is what the check reads: an engine started with another
    logprobs_mode is refused by name, and both engines are detached, still serving."""
    kwargs = {**KW, "kv_events_config": EVENTS, "logprobs_mode": "raw_logprobs"}
    other = EngineLaunch(kwargs, f"tcp://127.0.0.1:{free_port_block()}", KEY)
    try:
        wait_ready(other.proc, other.status, None, 300)
        with pytest.raises(InvalidRequestError, match=r"^the engines must answer a request "
                                                      r"alike: logprobs_mode is "
                                                      r"'processed_logprobs' at .* and "
                                                      r"'raw_logprobs' at tcp://127\.0\.0\.1"):
            DPClient(engine_addresses=[engines[0].address, other.address],
                     engine_key=KEY).close()
        assert engines[0].proc.poll() is None and other.proc.poll() is None
    finally:
        other.abort()


def test_a_request_is_checked_against_the_smallest_pool(engines):
    """Replicas' pools may differ (each sizes its own): the front checks a request against
    the smallest, so one that fits replica 0 and not replica 1 is refused at submit
    whichever replica it would go to (it was taken, and failed late on replica 1)."""
    kwargs = {**KW, "kv_events_config": EVENTS, "num_blocks": 16}     # 64 tokens
    small = EngineLaunch(kwargs, f"tcp://127.0.0.1:{free_port_block()}", KEY)
    try:
        wait_ready(small.proc, small.status, None, 300)
        with DPClient(engine_addresses=[engines[0].address, small.address],
                      engine_key=KEY) as front:
            assert front.info.num_blocks == 16
            assert front.info.max_model_len == front.replicas[0].info.max_model_len
            for rank in (None, 1, 0):
                with pytest.raises(InvalidRequestError, match=r"can never fit the KV pool "
                                                              r"\(16 blocks x 4"):
                    front.submit(list(range(1, 41)), greedy(40), data_parallel_rank=rank)
            out = front.submit(list(range(1, 41)), greedy(8), data_parallel_rank=1).result(60)
            assert out.error is None and len(out.outputs[0].token_ids) == 8
    finally:
        small.abort()


def test_the_front_takes_only_routing_knobs_and_one_replica_per_address():
    cfg = front_config(["tcp://h:1", "tcp://h:9"], {"routing_policy": "cache_aware"})
    assert cfg.data_parallel_size == 2 and cfg.routing_policy == "cache_aware"
    with pytest.raises(InvalidRequestError, match="block_size, model: engine settings"):
        front_config(["tcp://h:1", "tcp://h:9"], {"model": "x", "block_size": 8})
    with pytest.raises(InvalidRequestError, match="data_parallel_size 3 conflicts"):
        front_config(["tcp://h:1", "tcp://h:9"], {"data_parallel_size": 3})
    with pytest.raises(InvalidRequestError, match="tcp://h:1 given twice"):
        front_config(["tcp://h:1", "tcp://h:9", "tcp://h:1"], {})
    with pytest.raises(InvalidRequestError, match="address"):
        DPClient(engine_addresses=["tcp://h:1"], address="tcp://h:5")


def test_a_wildcard_bind_is_reached_at_the_connect_host():
    ev = P.KVEventsEndpoints("tcp://0.0.0.0:5003", "tcp://*:5004", "t")
    seen = P.kv_events_seen_from(ev, "tcp://10.1.2.3:5000")
    assert seen == P.KVEventsEndpoints("tcp://10.1.2.3:5003", "tcp://10.1.2.3:5004", "t")
    assert P.seen_from("tcp://[::]:7", "tcp://*:5000") == "tcp://127.0.0.1:7"
    assert P.seen_from("tcp://10.0.0.9:7", "tcp://10.1.2.3:5000") == "tcp://10.0.0.9:7"
    assert P.seen_from("ipc:///x.kv-events", "tcp://h:1") == "ipc:///x.kv-events"


def test_the_clock_offset_of_an_engine_on_this_host_is_small(dp):
    assert all(abs(c.transport.clock_offset) < 5.0 for c in dp.replicas)


@pytest.mark.parametrize("engine_clock", [-5000.0, 5000.0])   # behind ours, ahead of it
def test_loads_read_another_hosts_stats_on_this_clock(engine_clock):
    """What the front sent after a replica's stats were built counts as waiting there,
    until stats built after it come, whatever the origin of that host's clock."""
    stats = [EngineStats()]
    replica = types.SimpleNamespace(fatal_error=None, engine_stats=lambda: stats[0],
                                    transport=types.SimpleNamespace(clock_offset=-engine_clock))
    front = DPClient.__new__(DPClient)
    front.replicas, front.size, front.closed = [replica], 1, False
    front.info = types.SimpleNamespace(block_size=4)
    front._sent, front._sent_blocks = [collections.deque()], [0]
    stats[0] = EngineStats(time=time.perf_counter() + engine_clock)
    front._note_sent(0, 8)
    assert front._loads()[0].waiting == 1 and front._loads()[0].active_blocks == 2
    stats[0] = EngineStats(time=time.perf_counter() + engine_clock, num_waiting=1)
    assert front._loads()[0].waiting == 1 and front._loads()[0].active_blocks == 0


def test_a_killed_engine_fails_only_its_requests(dp, engines):
    kill_replica_1(dp, lambda: os.kill(engines[1].proc.pid, signal.SIGKILL),
                   PROMPTS[:2], PROMPTS[2:4], 200, "client_timeout", 120)
    assert not dp.alive(1) and dp.alive(0) and dp.fatal_error is None
    every_policy_routes_to_0(dp)

"""KV events in vLLM's format: an engine's stream, decoded with a consumer written from
vLLM's schema (tests/engine/vllm_kv_events.py), rebuilds its prefix cache exactly, a
late subscriber catches up through the replay socket, the hashes are the documented
ones, and with events off the engine records nothing and keeps Python's hash."""
import threading

import pytest
import zmq

from engine.block_hash import key_tokens, prompt_block_hashes
from engine.config import InvalidRequestError, KVEventsConfig, make_config
from engine.core.core import LLMEngine
from engine.ipc import curve
from engine.ipc.kv_publisher import KVEventPublisher
from engine.kv_events import seq_bytes, seq_of
from engine.request import SamplingParams
from tests.engine.vllm_kv_events import CacheMirror, documented_hash
from tests.helpers import add_request

KEY = "k" * 64
BS = 4
EVENTS = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*",
          "replay_endpoint": "tcp://127.0.0.1:*", "topic": "kv"}


def run(engine, prompts, max_tokens=3):
    for p in prompts:
        add_request(engine, p, SamplingParams(max_tokens=max_tokens, temperature=0,
                                              ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.flush()


def socket(ctx, kind, endpoint, **opts):
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    curve.attach(sock, KEY)
    for k, v in opts.items():
        sock.setsockopt(getattr(zmq, k), v)
    sock.connect(endpoint)
    return sock


def replay(ctx, endpoint, start, mirror):
    """Ask for every batch from `start`; apply them; returns the last seq replayed."""
    req = socket(ctx, zmq.DEALER, endpoint)
    req.send_multipart([b"", seq_bytes(start)])
    last = start - 1
    while True:
        assert req.poll(20_000), "no replay answer"
        _, seq, payload = req.recv_multipart()
        if seq_of(seq) == -1:
            req.close()
            return last
        mirror.apply(seq_of(seq), payload)
        last = seq_of(seq)


def events_engine(**kw) -> tuple[LLMEngine, KVEventPublisher]:
    """An engine (replica 1 of 2) publishing its events on 127.0.0.1."""
    e = LLMEngine(make_config(model="dummy:tiny", device="cpu", num_blocks=24, block_size=BS,
                              data_parallel_size=2, data_parallel_rank=1,
                              kv_events_config=EVENTS, **kw))
    pub = KVEventPublisher(e.config.kv_events_config, EVENTS["endpoint"],
                           EVENTS["replay_endpoint"], KEY, BS, data_parallel_rank=1)
    e.kv_events.sink = pub.publish
    return e, pub


@pytest.fixture(scope="module")
def engine():
    e, pub = events_engine()
    yield e, pub
    pub.close()
    e.close()


def assert_mirrors_index(pool, blocks) -> None:
    """The mirror's map of a tier holds exactly the pool's indexed blocks, each with its
    tokens and its documented hash."""
    index = {pool.hash_fn(key): key for _, key in pool.index.items()}
    assert set(blocks) == set(index)
    for h, (parent, tokens) in blocks.items():
        assert list(tokens) == key_tokens(index[h])
        assert pool.block_hash[pool.index.get(index[h])] == h


def assert_mirrors_device_index(e, mirror) -> None:
    assert mirror.blocks
    assert_mirrors_index(e.pool, mirror.blocks)


def test_stream_rebuilds_the_cache_exactly(engine):
    e, pub = engine
    events, replay_ep = pub.bound
    ctx = zmq.Context()
    try:
        shared = list(range(1, 13))                         # three shared blocks
        run(e, [shared + [20 + i, 21, 22, 23, 24] for i in range(3)])   # before anyone listens
        sub = socket(ctx, zmq.SUB, events, SUBSCRIBE=b"kv")
        mirror = CacheMirror()
        # evictions (24 blocks, prompts of 5-9 blocks), a clear, and more after it
        run(e, [[100 + i] * 4 * (5 + i % 5) for i in range(8)])
        e.clear_prefix_cache()
        run(e, [shared + [7, 7, 7, 7], shared])
        last = replay(ctx, replay_ep, 0, mirror)              # the late subscriber catches up
        assert last == e.kv_events.seq
        run(e, [shared + [9] * 8])                           # then the live stream
        target = e.kv_events.seq
        while mirror.next_seq <= target:
            assert sub.poll(20_000), "live stream stalled"
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv"
            if seq_of(seq) > last:
                mirror.apply(seq_of(seq), payload)
        assert_mirrors_device_index(e, mirror)
        assert mirror.ranks == {1} and mirror.media == {"GPU"} and pub.dropped == 0
        assert e.counters.evictions > 0
    finally:
        ctx.destroy(linger=0)


def test_a_replay_holds_a_batch_queued_just_before_its_request():
    """The publisher thread has drained its queue; a step's batch is queued and a replay
    is asked for before the thread looks for requests. The answer holds that batch (a
    late subscriber waits for the engine's latest seq); it was once answered without it,
    and a loaded CI box met that."""
    e, pub = events_engine()
    ctx = zmq.Context()
    req = socket(ctx, zmq.DEALER, pub.bound[1])
    drain, raced = pub._drain, threading.Event()

    def drain_then_race():          # runs on the publisher thread, once
        ok = drain()
        if not raced.is_set():
            run(e, [[5] * 8])                               # queued after the drain
            req.send_multipart([b"", seq_bytes(0)])
            assert pub._replay.poll(20_000)                 # the request has arrived
            raced.set()
        return ok

    pub._drain = drain_then_race
    try:
        assert raced.wait(20)
        seqs = []
        while True:
            assert req.poll(20_000), "no replay answer"
            _, seq, _ = req.recv_multipart()
            if seq_of(seq) == -1:
                break
            seqs.append(seq_of(seq))
        assert seqs and seqs[-1] == e.kv_events.seq, (seqs, e.kv_events.seq)
    finally:
        req.close()
        ctx.destroy(linger=0)
        pub.close()
        e.close()


def test_host_tier_events_rebuild_both_tiers():
    """With a host tier, blocks the device evicts go to the host (BlockStored, medium
    "CPU", as vLLM's offloading connector's), leave it when the host evicts them
    (BlockRemoved "CPU") and come back on a prefix hit (BlockStored "GPU"): the stream
    rebuilds both indexes exactly, the reloaded chain carries the documented hashes, and
    a clear empties both."""
    # 40 KiB: 20 host blocks of dummy:tiny (2 KiB a block), fewer than the prompts offload
    e, pub = events_engine(kv_offloading_size=40 / 1024 ** 2)
    ctx = zmq.Context()
    try:
        assert e.host.num_blocks == 20
        shared = list(range(1, 13)) + [40, 41, 42, 43, 44]   # four full blocks
        run(e, [shared])
        run(e, [[100 + i] * 4 * 5 for i in range(6)])        # evicts (offloads) them
        assert e.counters.kv_offload_blocks >= 4
        run(e, [shared + [9] * 4])                            # reloaded from the host
        assert e.counters.kv_reload_blocks >= 4
        mirror = CacheMirror()
        assert replay(ctx, pub.bound[1], 0, mirror) == e.kv_events.seq
        assert set(prompt_block_hashes(shared, BS)) <= set(mirror.blocks)
        run(e, [[300 + i] * 4 * 6 for i in range(8)])        # the host evicts too
        assert e.counters.host_evictions > 0
        assert replay(ctx, pub.bound[1], mirror.next_seq, mirror) == e.kv_events.seq
        assert mirror.media == {"GPU", "CPU"}
        assert_mirrors_device_index(e, mirror)
        assert mirror.tiers["CPU"] and len(e.host.pool.index) == len(mirror.tiers["CPU"])
        assert_mirrors_index(e.host.pool, mirror.tiers["CPU"])
        e.clear_prefix_cache()
        assert replay(ctx, pub.bound[1], mirror.next_seq, mirror) == e.kv_events.seq
        assert mirror.tiers["CPU"] == {} and mirror.blocks == {}
    finally:
        ctx.destroy(linger=0)
        pub.close()
        e.close()


def test_a_replay_holds_every_batch_queued_before_its_request():
    """A late subscriber asks for a replay right after the engine published its latest
    batch: the answer holds every batch queued before the request, even while the
    publisher is still sending a backlog (it drains its queue before it answers)."""
    from engine.core.kv.kv_events import CLEARED
    n = 20_000
    cfg = KVEventsConfig.parse({**EVENTS, "buffer_steps": n})
    pub = KVEventPublisher(cfg, EVENTS["endpoint"], EVENTS["replay_endpoint"], KEY, BS)
    ctx = zmq.Context()
    try:
        req = socket(ctx, zmq.DEALER, pub.bound[1])
        req.send_multipart([b"", seq_bytes(0)])          # the CURVE handshake, done
        assert req.poll(20_000) and seq_of(req.recv_multipart()[1]) == -1
        for seq in range(n):                              # a backlog, then the request
            pub.publish(seq, 0.0, [[CLEARED]])
        req.send_multipart([b"", seq_bytes(0)])
        seqs = []
        while True:
            assert req.poll(20_000), "no replay answer"
            seq = seq_of(req.recv_multipart()[1])
            if seq == -1:
                break
            seqs.append(seq)
        assert seqs == list(range(n))
    finally:
        ctx.destroy(linger=0)
        pub.close()


def test_hashes_are_stable_and_documented(engine):
    """The engine's chain is the documented hash, whatever the process (and a router's
    prompt_block_hashes computes the same)."""
    e, _ = engine
    prompt = list(range(50, 63))
    add_request(e, prompt, SamplingParams(max_tokens=1, temperature=0))
    while e.has_unfinished():
        e.step()
    e.flush()
    chain, parent = [], None
    for i in range(3):
        parent = documented_hash(parent, prompt[i * BS:(i + 1) * BS])
        chain.append(parent)
    cached = {e.pool.hash_fn(key) for _, key in e.pool.index.items()}
    assert set(chain) <= cached
    assert prompt_block_hashes(prompt, BS) == chain


def test_events_off_record_nothing():
    e = LLMEngine(make_config(model="dummy:tiny", device="cpu", num_blocks=16, block_size=BS))
    try:
        assert e.kv_events is None and e.pool.kv_events is None and e.pool.hash_fn is hash
        run(e, [list(range(1, 10))])
        assert len(e.pool.index) == 2
    finally:
        e.close()


def test_config_in_vllms_shape():
    cfg = KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "zmq", '
                               '"endpoint": "tcp://127.0.0.1:5557", "topic": "t"}')
    assert cfg.enabled and cfg.replay_endpoint is None and cfg.buffer_steps == 10_000
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").enabled
    assert KVEventsConfig(endpoint="tcp://*:5557", replay_endpoint="ipc:///tmp/r").endpoint


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:notaport", "tcp://127.0.0.1",
                                      "tcp://:5557", "tcp://h:0", "tcp://h:70000", "ipc://",
                                      "udp://h:1"])
def test_an_endpoint_zmq_cannot_bind_is_refused_in_one_line(endpoint):
    """It was taken, and the engine process failed at its bind with zmq's
    'ZMQError: Invalid argument' (or int()'s error for replica 1's PORT+1)."""
    for name in ("endpoint", "replay_endpoint"):
        with pytest.raises(InvalidRequestError, match=f"kv_events_config {name} must be "
                                                      "tcp://HOST:PORT or ipc:///PATH"):
            KVEventsConfig.parse({"enable_kv_cache_events": True, name: endpoint})


def test_router_index_joins_late_and_follows(engine):
    """The data-parallel front's index (engine/front/kv_index.py) catches up on what was
    published before it subscribed (replay), then follows the live stream."""
    from engine.front.kv_index import KVIndexFeed
    e, pub = engine
    feed = KVIndexFeed([pub.bound], [KEY], ["kv"])
    try:
        assert feed.wait_for(0, e.kv_events.seq, 30)
        # a batch announced but not sent yet (still in the publisher's queue) is not lost
        assert not feed.wait_for(0, e.kv_events.seq + 1, 0.3)
        run(e, [list(range(200, 221))])
        assert feed.wait_for(0, e.kv_events.seq, 30)
        cache = feed.caches[0]
        assert cache.hashes == {e.pool.hash_fn(key) for _, key in e.pool.index.items()}
        assert cache.lost == 0
    finally:
        feed.close()


def test_an_engine_in_this_process_refuses_events_and_replicas():
    """The engine process publishes; a thread of the caller (EngineLoop) refuses the
    config before it loads anything (LLM starts an engine process for it:
    tests/engine/front/test_llm_kv_events.py)."""
    from engine.front.loop import EngineLoop
    from tests.helpers import refused
    on = {"enable_kv_cache_events": True}
    refused("own process", EngineLoop, model="dummy:tiny", device="cpu", kv_events_config=on)
    refused("own process", EngineLoop, model="dummy:tiny", device="cpu",
            data_parallel_size=2)

"""The engine core in its own process: protocol, outputs, clients that die, an engine that
dies, a second client attached from another process, clean shutdown."""
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import msgspec
import numpy as np
import pytest

from engine import LLM, SamplingParams
from engine.front.client import EngineClient
from engine.config import InvalidRequestError, KnobChanges
from engine.ipc import protocol as P
from engine.outputs import CoreRequest, FinishedRequest, StepOutput, TokenTrace
from engine import commands as C
from devtools.procs import process_state
from tests.helpers import engines_owned_by

GREEDY = dict(temperature=0, ignore_eos=True)
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we proceed"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def engine_pids() -> list[int]:
    """Live engine-core processes started from this test process."""
    return engines_owned_by(os.getpid())


@pytest.fixture(scope="module")
def client():
    # a short client_timeout: test_killed_client_... waits for it (the default is 60 s)
    c = EngineClient(model="default", device="cpu", num_blocks=256, label="test",
                     client_timeout=3.0)
    yield c
    c.close()
    assert not engine_pids(), "engine process left behind"


def test_protocol_round_trips():
    msgs = [P.Hello("tui"), CoreRequest("r1", (1, 2, 3), SamplingParams(max_tokens=4), 1.5, "hi"),
            CoreRequest("r2", (4,), SamplingParams(stop=["x"], seed=3), 2.0, None, priority=-7),
            C.SetKnobs(KnobChanges(scheduling_policy="lpm", eviction_policy="lfu")),
            C.Abort("r1", "stop"), C.SetKnobs(KnobChanges(max_num_seqs=3)), C.SetPaused(True),
            C.StepOnce(7), C.ResetPrefixCache(), C.ResetPeakUsage(), C.Barrier(9),
            P.Heartbeat(), P.Bye(), P.Shutdown()]
    for m in msgs:
        assert P.client_decoder.decode(P.encoder.encode(m)) == m
    trace = TokenTrace("b", 2, np.array([5, 6], "<i4").tobytes(),
                       np.array([1.5, 2.0], "<f8").tobytes(), bytes(2))
    out = StepOutput(2.0, ["a", "b"], [5, 6], [FinishedRequest("a", "length", None, 1.0, 16, 0),
                                               FinishedRequest("b", "stop", None, 1.0, 0, 0,
                                                               trace=trace)])
    again = P.core_decoder.decode(P.encoder.encode(out))
    assert again == out and again.finished[1].trace.ids().tolist() == [5, 6]
    with pytest.raises(msgspec.ValidationError):     # a wrong type never reaches the core
        P.client_decoder.decode(P.encoder.encode({"type": "CoreRequest", "request_id": {},
                                                  "prompt_token_ids": "x", "params": {},
                                                  "arrival_time": 0.0}))


def test_snapshot_round_trip(client):
    assert client.wait_idle(30)
    snap = client.snapshot()
    again = P.decode_snapshot(P.encoder.encode(P.snapshot_frame(snap)))
    assert type(again) is type(snap) and again == dataclasses.replace(
        snap, block_state=again.block_state, block_refcount=again.block_refcount)
    assert again.step == snap.step and again.knobs == snap.knobs
    assert np.array_equal(again.block_state, snap.block_state)
    assert np.array_equal(again.block_refcount, snap.block_refcount)
    assert again.requests == snap.requests and again.counters == snap.counters


QUIET_TOKENS = 40    # steps with no frame: the frames stopped (watched, one comes every few
#                      steps, as often as its cost allows: loaded or not)


def _events(stream, timeout: float = 60.0):
    """The stream's events, each within `timeout` s (a stalled engine fails, not hangs)."""
    while stream.output is None:
        yield stream.get(timeout=timeout)


def _quiet_stretch(client, stream) -> bool:
    """Read `stream` until QUIET_TOKENS tokens arrive with no snapshot frame among them
    (True), or it ends first (False)."""
    held, quiet = client.transport._snap_bytes, 0
    for event in _events(stream):
        if client.transport._snap_bytes is not held:
            held, quiet = client.transport._snap_bytes, 0
        quiet += len(event.token_ids)
        if quiet >= QUIET_TOKENS:
            return True
    return False


def _frame_while_running(client, stream) -> bool:
    """Read `stream` until a snapshot frame arrives that shows it still decoding (a
    periodic frame, not the one taken on going idle): True, or False if it ends first."""
    held = client.transport._snap_bytes
    for _ in _events(stream):
        if client.transport._snap_bytes is not held:
            held = client.transport._snap_bytes
            view = client.snapshot().request(stream.request_id)
            if view is not None and view.state == "decoding":
                return True
    return False


def test_dropping_snapshots_stops_their_frames_and_taking_them_restarts_them(client):
    """watch(False): once the unsubscribe lands no frame arrives while the engine steps
    (nor does it build one: tests/engine/core/test_core_loop_snapshots.py); watch(True):
    the engine process sees the subscription and publishes while it steps again.
    Waits on tokens and frames, never on time."""
    client.watch(False)
    stream = client.submit(PROMPTS[2], SamplingParams(max_tokens=400, **GREEDY))
    try:
        assert _quiet_stretch(client, stream), "frames kept coming while nobody subscribed"
        client.watch(True)
        assert _frame_while_running(client, stream), "no frame after subscribing again"
    finally:
        client.watch(True)
        stream.cancel()
    assert client.wait_idle(60)


def test_the_engine_times_its_garbage_collections(client):
    """The engine collects when it goes idle (at most every IDLE_COLLECT_EVERY s), and
    every collection's pause reaches the counters (what watching or serving costs the
    engine in GC, next to snapshots and the device)."""
    from engine.ipc.proc_setup import IDLE_COLLECT_EVERY
    time.sleep(IDLE_COLLECT_EVERY + 0.2)     # the last idle collection is old enough
    before = client.snapshot().counters.gc_pause_us
    client.submit(PROMPTS[1], SamplingParams(max_tokens=48, **GREEDY)).result(timeout=60)
    assert client.wait_idle(30)
    assert client.snapshot().counters.gc_pause_us > before


def test_greedy_outputs_equal_in_process(client):
    sp = SamplingParams(max_tokens=24, **GREEDY)
    ref = LLM(model="default", device="cpu").generate(PROMPTS, sp)
    streams = [client.submit(p, sp) for p in PROMPTS]
    for s, r in zip(streams, ref):
        out = s.result(timeout=60)
        assert out.outputs[0].token_ids == r.outputs[0].token_ids
        assert out.outputs[0].text == r.outputs[0].text and out.metrics.ttft > 0
    events = list(client.submit(PROMPTS[0], sp))            # a token stream, step by step
    assert events[-1].finished and sum(len(e.token_ids) for e in events) == 24
    assert "".join(e.text for e in events) == ref[0].outputs[0].text


def test_stop_string_and_refusal(client):
    out = client.submit("ROMEO:", SamplingParams(max_tokens=40, temperature=0, stop=["King"]))
    res = out.result(timeout=60)
    assert res.outputs[0].finish_reason == "stop" and "King" not in res.outputs[0].text
    bad = client.submit({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=2),
                        request_id="dup-check")
    assert bad.result(timeout=30).error is None
    assert client.wait_idle(30)
    snap = client.snapshot()
    assert not [r for r in snap.requests if r.state in ("waiting", "prefilling", "decoding")]


def test_second_process_sees_the_same_engine(client):
    client.pause()
    assert client.step_once().wait(30)
    assert client.wait_idle(30)
    step = client.snapshot().step
    code = textwrap.dedent(f"""
        from engine.front.client import EngineClient
        c = EngineClient(connect={client.address!r}, label="viewer")
        print("STEP", c.snapshot().step, c.info.model_name, flush=True)
        c.close()
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    client.resume()
    assert f"STEP {step} default" in res.stdout, res.stderr[-2000:]
    assert client.wait_idle(30) and not client.fatal_error      # the viewer left it serving


def test_killed_client_gets_an_error_and_its_blocks_are_freed(client):
    code = textwrap.dedent(f"""
        import sys
        from engine import SamplingParams
        from engine.front.client import EngineClient
        c = EngineClient(connect={client.address!r}, label="doomed")
        s = c.submit("ROMEO:", SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True),
                     request_id="doomed-1")
        s.get(timeout=60)
        print("STREAMING", flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "STREAMING"
        client.pause()        # 1000 tokens take under the 3 s client_timeout on cpu_native
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    deadline = time.monotonic() + 60         # 3 s of silence, then the next check
    while time.monotonic() < deadline:
        view = client.snapshot().request("doomed-1")
        if view is not None and view.state == "error":
            break
        time.sleep(0.1)
    client.resume()
    # the engine gave up on a silent client: an error, never a silent cancel
    assert view is not None and view.state == "error" and view.output_tokens < 1000
    assert "heard nothing from this client for 3 s" in view.error
    assert client.wait_idle(30)
    snap = client.snapshot()
    assert snap.num_used == 0            # its blocks went back (free, or cached)


def test_killed_engine_ends_every_stream_at_once():
    """A SIGKILLed engine ends every open stream with an error in seconds (the streams
    would otherwise run on for minutes: 2000 tokens each); the bound is generous for a
    busy 2-core machine."""
    c = EngineClient(model="default", device="cpu", num_blocks=256, label="victim")
    try:
        sp = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)
        streams = [c.submit(p, sp) for p in PROMPTS]
        streams[0].get(timeout=60)
        os.kill(c.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        for s in streams:
            out = s.result(timeout=10.0)
            assert out.outputs[0].finish_reason == "error" and "engine process died" in out.error
        assert time.monotonic() - t0 < 10.0
        with pytest.raises(RuntimeError, match="engine process died"):
            c.submit("ROMEO:", sp)
    finally:
        c.close()
    assert c.proc.pid not in engine_pids()


def test_an_engine_stopped_by_sigterm_is_reaped_before_its_client_closes():
    """SIGTERM: the engine sends Fatal and exits; its client collects the exit at once
    (no zombie until close), says why it cannot serve, and close still works, twice."""
    c = EngineClient(model="dummy:tiny", device="cpu", num_blocks=64, label="reaped")
    pid = c.proc.pid
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while c.proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.proc.returncode is not None and process_state(pid) != "Z"
        assert c.fatal_error and c.unavailable == c.fatal_error
    finally:
        c.close()
        c.close()
    assert c.proc.returncode is not None and pid not in engine_pids()




def test_bad_engine_flags_fail_fast_with_the_engines_message(client):
    before = set(engine_pids())
    with pytest.raises(Exception, match="unknown dummy preset"):
        EngineClient(model="dummy:nosuch", device="cpu")
    with pytest.raises(InvalidRequestError) as refused:     # its name once, not twice
        EngineClient(model="default", device="cpu", max_model_len=10**6)
    assert str(refused.value).startswith("max_model_len (1000000) is greater than")
    assert set(engine_pids()) <= before


def test_two_clients_changing_different_knobs_lose_neither(client):
    other = EngineClient(connect=client.address, label="knobs")
    try:
        before = client.snapshot().knobs
        client.set_knobs(max_num_seqs=5)
        other.set_knobs(max_num_batched_tokens=100)     # its view predates the change above
        assert other.wait_idle(30) and client.wait_idle(30)   # each one's messages applied
        knobs = client.snapshot().knobs
        assert (knobs.max_num_seqs, knobs.max_num_batched_tokens) == (5, 100)
    finally:
        client.set_knobs(max_num_seqs=before.max_num_seqs,
                         max_num_batched_tokens=before.max_num_batched_tokens)
        other.close()


def test_policy_knobs_and_priority_reach_the_engine_process(client):
    """Choice-valued knobs travel in SetKnobs; a request's priority travels in Submit and
    orders admission under scheduling_policy=priority."""
    before = client.snapshot().knobs
    sp = SamplingParams(max_tokens=4, **GREEDY)
    with pytest.raises(InvalidRequestError, match="priority"):
        client.submit("ROMEO:", sp, priority=2 ** 40)
    try:
        client.pause()
        client.set_knobs(scheduling_policy="priority", max_num_seqs=1)
        low = client.submit("ROMEO:", sp, priority=5)
        high = client.submit("JULIET:", sp, priority=-3)
        client.resume()
        low_out, high_out = low.result(timeout=60), high.result(timeout=60)
        assert high_out.metrics.first_token_time < low_out.metrics.first_token_time
        assert client.wait_idle(30) and client.snapshot().knobs.scheduling_policy == "priority"
        again = P.decode_snapshot(P.encoder.encode(P.snapshot_frame(client.snapshot())))
        assert again.kv_block_metrics == client.snapshot().kv_block_metrics
    finally:
        client.set_knobs(scheduling_policy=before.scheduling_policy,
                         max_num_seqs=before.max_num_seqs)
        client.resume()

"""Liveness on the default path (the engine in its own process), with a short
client_timeout (3 s; the default is 60 s) so that the tests see both sides of it: a
client stopped past the timeout is dropped, told, and attaches again; a consumer's slow
callback cancels none of its client's other requests; a client that really goes silent
gets its requests ended with an error (never a silent cancel); and a pause belongs to
the client that made it: it ends when that client leaves (Bye) or is judged dead.
Stops of the engine itself: tests/engine/ipc/test_engine_stall.py."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zmq

from engine import SamplingParams
from engine.ipc.attach import open_socket
from engine.front.client import EngineClient
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.outputs import CoreRequest, StepOutput
from engine import commands as C
from tests.helpers import wait_for

pytestmark = pytest.mark.slow       # the long tier: `pytest --run-slow` (README)

CLIENT_TIMEOUT = 3.0
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we proceed"]
TIMEOUT = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def sp(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def owner():
    c = EngineClient(model="default", device="cpu", num_blocks=256, label="owner",
                     client_timeout=CLIENT_TIMEOUT)
    yield c
    c.close()


@pytest.fixture(scope="module")
def solo(owner):
    return {p: list(owner.submit(p, sp(300)).result(TIMEOUT).outputs[0].token_ids)
            for p in PROMPTS}


STOPPED_CLIENT = """
import sys
from engine import SamplingParams
from engine.front.client import EngineClient
c = EngineClient(connect=sys.argv[1], label="stopped", snapshots=False)
sp = SamplingParams(max_tokens=900, temperature=0, ignore_eos=True)
stream = c.submit("ROMEO:", sp, request_id="stopped-1")
stream.get(60)
print("STREAMING", flush=True)
out = stream.result(60)
print("FIRST", out.outputs[0].finish_reason, out.error, flush=True)
sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
try:
    out = c.submit("ROMEO:", sp).result(30)
    print("SECOND", out.outputs[0].finish_reason, out.error, flush=True)
except Exception as exc:
    print("SECOND hung", repr(exc), flush=True)
c.close()
"""


def test_a_client_stopped_past_client_timeout_is_told_and_attaches_again(owner):
    """A client process stopped (SIGSTOP) past client_timeout is dropped by the engine;
    once it runs again, its open request ends with an error that says so, and its next
    request is served (before: every later Submit was discarded, a black hole). The
    server's case: tests/roseplay/serve/test_serve_liveness.py."""
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_CLIENT, owner.address],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "STREAMING"
        # paused, the request is still open when client_timeout drops its client, however
        # fast this CPU decodes (its 900 tokens can end in ~1.3 s, before the 3 s)
        owner.pause()
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: (r := owner.snapshot().request("stopped-1")) is not None
                     and r.finish_reason == "error")        # the engine dropped it
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            owner.resume()
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert second.strip() == "SECOND length None", second     # served again
    assert first.startswith("FIRST error ") and "dropped it" in first, first


def test_a_slow_callback_cancels_none_of_its_clients_other_requests(owner, solo):
    slept = threading.Event()

    def slow(event):
        if not slept.is_set():
            slept.set()
            time.sleep(CLIENT_TIMEOUT + 1.0)         # holds this client's IO thread
    slow_stream = owner.submit(PROMPTS[0], sp(300), on_event=slow)
    others = [owner.submit(p, sp(300)) for p in PROMPTS]
    outs = [s.result(TIMEOUT) for s in others]
    assert slept.is_set()
    for p, out in zip(PROMPTS, outs):
        assert (out.error, out.outputs[0].finish_reason) == (None, "length")
        assert list(out.outputs[0].token_ids) == solo[p]
    assert owner.wait_idle(TIMEOUT)
    del slow_stream


class RawClient:
    """A client that says Hello (past the CURVE handshake, with the key) and then
    nothing: no heartbeats."""

    def __init__(self, address: str):
        self.ctx = zmq.Context()
        key = auth.read_key(address)
        self.send_sock, self.recv_sock = (open_socket(self.ctx, zmq.DEALER, ep, key,
                                                      b"silent-client")
                                          for ep in P.endpoints(address)[:2])
        while True:
            self.send(P.Hello("silent"))
            if self.recv_sock.poll(500) and isinstance(self.recv(), P.Welcome):
                return

    def send(self, msg):
        self.send_sock.send(P.encoder.encode(msg))

    def recv(self):
        return P.core_decoder.decode(self.recv_sock.recv())

    def close(self):
        self.send_sock.close(0)
        self.recv_sock.close(0)
        self.ctx.term()


def test_a_silent_client_gets_its_requests_ended_with_an_error(owner):
    raw = RawClient(owner.address)
    try:
        ids = owner.inputs.process(PROMPTS[0])[0].prompt_token_ids
        t0 = time.monotonic()
        raw.send(CoreRequest("silent-1", list(ids), {"max_tokens": 1000,
                                                  "ignore_eos": True}, 0.0))
        raw.send(C.SetPaused(True))                  # and it holds a pause
        finished = None
        while finished is None and raw.recv_sock.poll(TIMEOUT * 1000):
            msg = raw.recv()
            if isinstance(msg, StepOutput) and msg.finished:
                finished = msg.finished[0]
        waited = time.monotonic() - t0
    finally:
        raw.close()
    assert finished is not None and finished.finish_reason == "error"
    assert "heard nothing from this client for 3 s" in finished.error
    assert CLIENT_TIMEOUT - 0.5 < waited < CLIENT_TIMEOUT + 20
    wait_for(lambda: not owner.snapshot().paused)     # its pause ended with it
    out = owner.submit(PROMPTS[1], sp(8)).result(TIMEOUT)
    assert out.outputs[0].finish_reason == "length"


def test_a_pause_ends_when_its_client_closes(owner):
    pauser = EngineClient(connect=owner.address, label="pauser")
    pauser.pause()
    wait_for(lambda: owner.snapshot().paused)
    stream = owner.submit(PROMPTS[2], sp(8))
    assert owner.snapshot().paused
    pauser.close()                                   # Bye: its pause goes with it
    out = stream.result(TIMEOUT)
    assert (out.error, out.outputs[0].finish_reason) == (None, "length")
    wait_for(lambda: not owner.snapshot().paused)


def test_a_pause_ends_when_its_client_is_killed(owner):
    code = textwrap.dedent(f"""
        import sys
        from engine.front.client import EngineClient
        c = EngineClient(connect={owner.address!r}, label="doomed-pauser")
        c.pause()
        print("PAUSED", flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "PAUSED"
        wait_for(lambda: owner.snapshot().paused)
        stream = owner.submit(PROMPTS[0], sp(8))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()
    out = stream.result(TIMEOUT)                     # after the pauser's client_timeout
    assert (out.error, out.outputs[0].finish_reason) == (None, "length")
    wait_for(lambda: not owner.snapshot().paused)

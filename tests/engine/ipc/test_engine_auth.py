"""The engine key (engine/ipc/auth.py, curve.py) on the default path: a stranger on the
engine address without the key (plain sockets, or CURVE with another key) never gets
past the handshake: no Welcome, no snapshot byte, no stats, and none of its commands
(pause, knobs, submit) has any effect; with the key (given, from the environment, or
from the owner's 0600 key file) a client attaches and works. A non-loopback bind without
a given key is refused before any process starts. Bigger attacks of peers without the
key: tests/engine/ipc/test_unauthenticated_peers.py."""
import os
import signal
import stat
import time

import pytest
import zmq

from engine import InvalidRequestError, SamplingParams
from engine.front.client import EngineClient, EngineKeyRefused
from engine.ipc import auth, curve, leftovers
from engine.ipc import protocol as P
from engine.outputs import CoreRequest
from engine import commands as C
from roseplay.serve.cli import main as serve_main
from tests.helpers import free_port_block, wait_for

TIMEOUT = 60
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def owner():
    c = EngineClient(model="default", device="cpu", num_blocks=256, label="owner",
                     address=f"tcp://127.0.0.1:{free_port_block(3)}")
    yield c
    path = auth.key_file(c.address)
    c.close()
    assert not os.path.exists(path)          # the engine removes its key file on exit


class Stranger:
    """Raw sockets on the engine address, as any local process could open them: plain
    (key=None) or CURVE with a key of its own. `failed()` once the engine has turned
    down its handshake."""

    def __init__(self, address: str, key: str | None = None):
        self.ctx = zmq.Context()
        in_ep, out_ep, pub_ep = P.endpoints(address)
        self.key = key
        self.send_sock = self._socket(zmq.DEALER)
        self.watch = curve.HandshakeWatch(self.send_sock)   # before it connects
        self.recv_sock = self._socket(zmq.DEALER)
        self.sub = self._socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")       # everything, were it applied
        for sock, endpoint in zip((self.send_sock, self.recv_sock, self.sub),
                                  (in_ep, out_ep, pub_ep)):
            sock.connect(endpoint)

    def _socket(self, kind):
        s = self.ctx.socket(kind)
        if kind == zmq.DEALER:
            s.setsockopt(zmq.IDENTITY, b"stranger")
        s.setsockopt(zmq.LINGER, 0)
        if self.key is not None:
            curve.attach(s, self.key)
        return s

    def send(self, msg):
        try:          # queued here: no connection ever completes its handshake
            self.send_sock.send(P.encoder.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def received(self, seconds: float) -> list:
        """Everything the engine sent this stranger within `seconds`."""
        got, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for sock in (self.recv_sock, self.sub):
                if sock.poll(min(50, int(left * 1000) + 1)):
                    got.append((sock is self.sub, sock.recv()))
        return got

    def close(self):
        self.watch.close()
        for s in (self.send_sock, self.recv_sock, self.sub):
            s.close(0)
        self.ctx.term()


def test_the_key_file_is_private(owner):
    path = auth.key_file(owner.address)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        assert len(f.read().strip()) == 64


@pytest.mark.slow
def test_a_killed_engines_key_file_does_not_outlive_it():
    """A killed engine cannot remove its key file: its owner does once it reaps it, and
    the next engine start removes one that an engine killed with its owner left."""
    stale = auth.key_file(f"tcp://127.0.0.1:{free_port_block(3)}")
    os.close(leftovers.lock_into_place(stale, b"0" * 64))   # as a SIGKILL leaves it
    c = EngineClient(model="dummy:tiny", device="cpu", label="owner", snapshots=False,
                     address=f"tcp://127.0.0.1:{free_port_block(3)}")
    path = auth.key_file(c.address)
    try:
        assert not os.path.exists(stale)               # swept by the start
        os.kill(c.proc.pid, signal.SIGKILL)
        c.proc.wait(TIMEOUT)
        assert os.path.exists(path)
    finally:
        c.close()
    assert not os.path.exists(path)


@pytest.mark.parametrize("key", [None, "wrong"], ids=["plain", "wrong-key"])
def test_a_stranger_gets_nothing_and_changes_nothing(owner, key):
    watcher = EngineClient(connect=owner.address, label="watcher")   # key from the key file
    stranger = Stranger(owner.address, key)
    try:
        knobs = owner.knobs
        ids = owner.inputs.process("ROMEO:")[0].prompt_token_ids
        for msg in (P.Hello("stranger"), C.SetPaused(True), C.StepOnce(1),
                    C.SetKnobs({"max_num_seqs": 1}), C.ResetPrefixCache(), C.Barrier(2),
                    CoreRequest("stolen", list(ids), {"max_tokens": 4}, 0.0), P.Shutdown()):
            stranger.send(msg)
        wait_for(stranger.watch.failed)           # the engine turned its handshake down
        busy = owner.submit("JULIET:", SamplingParams(max_tokens=200, temperature=0))
        got = stranger.received(1.5)              # while snapshots flow to the watcher
        assert busy.result(TIMEOUT).outputs[0].finish_reason in ("length", "stop")
        assert watcher.wait_idle(TIMEOUT)
        snap = watcher.snapshot()
    finally:
        stranger.close()
        watcher.close()
    assert got == []                              # no Welcome, no stats, no snapshot byte
    assert not snap.paused and snap.knobs == knobs
    assert snap.request("stolen") is None and owner.fatal_error is None
    assert owner.submit("ROMEO:", GREEDY).result(TIMEOUT).outputs[0].finish_reason == "length"


def test_a_client_with_a_wrong_key_is_refused_at_once(owner):
    t0 = time.monotonic()
    with pytest.raises(EngineKeyRefused, match="engine key missing or wrong"):
        EngineClient(connect=owner.address, engine_key="not-the-key", label="guess")
    assert time.monotonic() - t0 < 30


def test_the_key_from_the_environment_or_a_file_works(owner, monkeypatch, tmp_path):
    with open(auth.key_file(owner.address)) as f:
        key = f.read().strip()
    key_copy = tmp_path / "key"
    key_copy.write_text(key + "\n")
    monkeypatch.setenv(auth.ENGINE_KEY_ENV, f"@{key_copy}")
    with EngineClient(connect=owner.address, label="from-env") as c:
        out = c.submit("ROMEO:", GREEDY).result(TIMEOUT)
        assert out.outputs[0].finish_reason == "length" and c.snapshot() is not None
        assert c.engine_stats().num_blocks == 256
    monkeypatch.setenv(auth.ENGINE_KEY_ENV, "wrong")
    with pytest.raises(EngineKeyRefused):
        EngineClient(connect=owner.address, label="env-wrong")


def test_a_non_loopback_bind_without_a_key_is_refused(monkeypatch, capsys):
    monkeypatch.delenv(auth.ENGINE_KEY_ENV, raising=False)
    with pytest.raises(InvalidRequestError, match="not a loopback address.*--engine-key"):
        EngineClient(model="default", device="cpu", address="tcp://0.0.0.0:5555")
    assert serve_main(["--engine-address", "tcp://0.0.0.0:5555", "--device", "cpu"]) == 2
    assert "refusing to serve the engine at tcp://0.0.0.0:5555" in capsys.readouterr().err
    assert auth.is_loopback("tcp://127.0.0.1:5") and auth.is_loopback("tcp://[::1]:5")
    assert not auth.is_loopback("tcp://*:5") and not auth.is_loopback("tcp://10.0.0.1:5")

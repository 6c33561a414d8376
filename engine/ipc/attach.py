"""An engine client's attachment to the engine process: the handshake, heartbeats, the
engine's silence, and attaching again after the engine dropped this client.

One stall policy for every kind of client (the owner, an attached API server,
`roseplay --connect`): the engine is judged gone after `client_timeout` seconds (the
engine's setting, sent in its Welcome) without any message from it, counted in time this
process ran (engine/ipc/liveness.py), so a stop of either process shorter than that
ends nothing. When the engine dropped this client (it was stopped or starved longer than
client_timeout), the engine says so (Detached) and this client attaches again: what it
had sent until then is ended with an error, the rest is served. Re-attaching rather than
exiting keeps the engine and every other client's work: nothing is wrong with a process
that was stopped and came back (docs/RELIABILITY.md "Liveness").
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from engine.ipc import auth, curve
from engine.ipc import protocol as P
from engine.ipc.launch import EngineDied
from engine.ipc.liveness import HEARTBEAT_INTERVAL, Silence

logger = logging.getLogger(__name__)
WAIT_REPORT_S = 10.0     # how often a handshake still unanswered says so (on_wait)


class EngineKeyRefused(EngineDied):
    """The engine at the address refused this client's engine key."""


def open_socket(ctx: zmq.Context, kind: int, endpoint: str | None, key: str,
                ident: bytes | None = None, topic: bytes | None = None) -> zmq.Socket:
    """A client's socket to the engine (connected to `endpoint` unless None): CURVE with
    the engine key. A DEALER (commands, outputs) has no high-water marks: while either
    end is stopped, messages queue (for at most client_timeout) instead of blocking a
    sender or being dropped. A SUB keeps only the newest snapshot of `topic` (the
    key's: auth.snapshot_topic)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    curve.attach(sock, key)
    if kind == zmq.DEALER:
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    if ident is not None:
        sock.setsockopt(zmq.IDENTITY, ident)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.CONFLATE, 1)
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    if endpoint is not None:
        sock.connect(endpoint)
    return sock


def handshake(in_sock: zmq.Socket, out_sock: zmq.Socket, label: str, address: str,
              timeout: float, engine_alive: Callable[[], bool],
              on_wait: Callable[[str], None] | None = None) -> P.Welcome:
    """Connect `in_sock` (not yet connected) and say Hello until Welcome (the engine can
    route to us only once our out socket is connected, so an early Welcome may be
    dropped: ask again). A failed CURVE handshake means that the key we hold is not the
    engine's: EngineKeyRefused at once. While nobody answers, on_wait hears so every
    WAIT_REPORT_S (an engine may still be loading there, or none runs: the caller's
    user should know which wait this is)."""
    watch = curve.HandshakeWatch(in_sock)      # before connecting: no failure is missed
    in_sock.connect(P.endpoints(address)[0])
    try:
        start = time.monotonic()
        deadline, report = start + timeout, start + WAIT_REPORT_S
        while time.monotonic() < deadline and engine_alive():
            in_sock.send(P.encoder.encode(P.Hello(label[:P.MAX_LABEL_CHARS])))
            if out_sock.poll(500):
                msg = P.core_decoder.decode(out_sock.recv())
                if isinstance(msg, P.Welcome):
                    return msg
            if watch.failed():
                raise EngineKeyRefused(
                    f"engine at {address}: engine key missing or wrong (the engine could "
                    f"not open this client's handshake): give it with --engine-key or "
                    f"${auth.ENGINE_KEY_ENV} (the engine's owner wrote it, mode 0600, to "
                    "its key file: docs/SERVE.md, Security)")
            if on_wait is not None and time.monotonic() >= report:
                report += WAIT_REPORT_S
                on_wait(f"no engine answers at {address} yet ({time.monotonic() - start:.0f} s "
                        f"of {timeout:.0f}; one may still be loading there, else start it: "
                        f"`roseplay serve --headless --engine-address {address}`)")
        raise EngineDied(f"no engine answered at {address} in {timeout:.0f} s")
    finally:
        watch.close()


class Attachment:
    """Heartbeats (a thread of their own: never late because a consumer's callback holds
    the IO thread), the engine's silence, and the state of attaching again."""

    def __init__(self, send: Callable[[object], None], label: str, timeout: float):
        self._send, self.label = send, label
        self.silence = Silence(timeout)
        self.detached: str | None = None        # why, while our new Hello is on its way
        self._stopping = threading.Event()
        self._beat = threading.Thread(target=self._beat_loop, daemon=True,
                                      name=f"roseplay-{label}-heartbeat")

    def start(self) -> None:
        self._beat.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float) -> None:
        if self._beat.is_alive():
            self._beat.join(timeout)

    def engine_silent(self) -> bool:
        """Call after reading what was queued: True once the engine said nothing for
        client_timeout seconds of this process's running time."""
        return self.silence.expired()

    def detach(self, why: str) -> bool:
        """The engine says we are not attached. True when this starts attaching again
        (the caller then ends what it sent so far and says Hello); False while a Hello is
        on its way already (the engine answers what we sent before it)."""
        if self.detached is not None:
            return False
        self.detached = why
        logger.warning("%s: %s; attaching again (its open requests end with an error)",
                       self.label, why)
        return True

    def welcomed(self) -> None:
        if self.detached is not None:
            logger.warning("%s: attached to the engine again", self.label)
        self.detached = None

    def _beat_loop(self) -> None:
        interval = min(HEARTBEAT_INTERVAL, self.silence.timeout / 4)
        while not self._stopping.wait(interval):
            try:
                self._send(P.Heartbeat())
            except zmq.ZMQError:
                return

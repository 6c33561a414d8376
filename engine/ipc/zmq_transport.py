"""ZmqTransport: the CoreTransport (engine/ipc/transport.py) to an engine core in another
process, over ZMQ.

`ZmqTransport(model=...)` starts the engine-core process (engine/ipc/core_proc.py) and
owns it; `ZmqTransport(connect="tcp://127.0.0.1:PORT")` attaches to one that another
process (a bench, a server) started and leaves it serving on close. Requests and
commands go out as they are (engine/ipc/protocol.py). One IO thread receives step
outputs (one message per step for all of this client's requests), engine stats and
snapshots (conflated: only the newest is kept, decoded when read) and hands them to the
front. Attaching needs the engine key (engine/ipc/auth.py, curve.py); heartbeats, the
engine's silence and attaching again after the engine dropped this client are
engine/ipc/attach.py's.
"""
from __future__ import annotations

import itertools
import subprocess
import threading
import time
import uuid
from typing import Callable

import msgspec
import zmq

from engine.commands import Barrier, StepOnce
from engine.config import InvalidRequestError, SchedulerConfig
from engine.engine_stats import EngineStats
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.ipc.attach import Attachment, handshake, open_socket
from engine.ipc.launch import EngineLaunch, stop_engine, wait_ready
from engine.outputs import EngineInfo, StepOutput
from engine.snapshot import EngineSnapshot
from engine.tokenizer import load_tokenizer

STARTUP_TIMEOUT = 900.0
REAP_POLL_S = 0.1    # how often a stopped engine's process is checked for its exit


class ZmqTransport:
    def __init__(self, *, connect: str | None = None, address: str | None = None,
                 label: str = "client", on_progress: Callable[[str], None] | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT, snapshots: bool = True,
                 launch: EngineLaunch | None = None, engine_key: str | None = None,
                 **engine_kwargs):
        """snapshots=False: no periodic snapshots (a bench): snapshot() then returns the
        one taken by the last wait_idle(), and the engine builds none while nobody else
        subscribes. launch: an engine process already spawned (engine/ipc/launch.py),
        taken over here (several engines then load at once). engine_key: the key to
        show (default: $ROSEPLAY_ENGINE_KEY, else the address's key file; an owner
        without either makes a random one)."""
        self.label, self.snapshots = label, snapshots
        self._want_snapshots = True
        self.proc = self._tmpdir = self._launch_address = None
        self.fatal_error: str | None = None
        self.closed = False
        self.tokenizer = None
        self._owner_token = None
        if connect is None:
            launch = launch or EngineLaunch(engine_kwargs, address, engine_key)   # bad knobs:
            self.proc, self._tmpdir = launch.proc, launch.tmpdir                # refused here
            self._launch_address, self.engine_key = launch.address, launch.engine_key
            self._owner_token, address, status = launch.owner_token, launch.address, launch.status
            try:      # while the engine process imports torch and loads the model
                self.tokenizer = load_tokenizer(launch.config.model)
            except BaseException:
                status.close()
                self._reap()
                raise
            try:
                wait_ready(self.proc, status, on_progress, startup_timeout)
            except BaseException:
                self._reap()
                raise
        else:
            self.engine_key = auth.read_key(connect, engine_key) or ""
        self.address = connect or address
        self._topic = auth.snapshot_topic(self.engine_key)
        self._stats = EngineStats()
        self._ctx = zmq.Context()
        self._send_lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._waiters: dict[int, tuple[threading.Event, list]] = {}
        self._snap_bytes: bytes | None = None
        self._snap_cache: tuple[bytes | None, EngineSnapshot | None] = (None, None)
        self._front = None
        self._connect(startup_timeout if connect else 30.0, on_progress if connect else None)

    def _connect(self, timeout: float, on_wait: Callable[[str], None] | None = None) -> None:
        _, out_ep, pub_ep = P.endpoints(self.address)
        ident = f"{self.label}-{uuid.uuid4().hex[:8]}".encode()
        key = self.engine_key
        self._in = open_socket(self._ctx, zmq.DEALER, None, key, ident)   # handshake() connects
        self._out = open_socket(self._ctx, zmq.DEALER, out_ep, key, ident)
        self._sub = open_socket(self._ctx, zmq.SUB, pub_ep, key, topic=self._topic) \
            if self.snapshots else None
        try:
            welcome = handshake(self._in, self._out, self.label, self.address, timeout,
                                lambda: self.proc is None or self.proc.poll() is None, on_wait)
        except BaseException:
            self._close_sockets()
            raise
        self._clock(welcome)      # as it arrives (not after the first snapshot's wait)
        self._attach = Attachment(self.send, self.label, welcome.client_timeout)
        deadline = time.monotonic() + 10.0      # the first snapshot: snapshot() is never None
        while self._sub is not None and self._snap_bytes is None and time.monotonic() < deadline:
            if self._sub.poll(100):
                self._snap_bytes = self._recv_snapshot()
        self.info: EngineInfo = welcome.info
        self.knobs: SchedulerConfig = welcome.knobs     # at attach: the front keeps them
        self.paused = welcome.paused
        # where it publishes its KV events, as reached from here (None: it publishes none)
        self.kv_events = P.kv_events_seen_from(welcome.kv_events, self.address)
        if self.proc is None:     # attached: the engine says which model it serves
            self.tokenizer = load_tokenizer(self.info.model_name)
        self._max_message = P.max_message_bytes(self.info.max_model_len)   # its MAXMSGSIZE

    def _clock(self, welcome: P.Welcome) -> None:
        """clock_offset: our perf_counter minus the engine's (0 on one host, up to the
        Welcome's way here later), so an engine time + clock_offset is ours; another
        host's CLOCK_MONOTONIC has its own origin."""
        self.clock_offset = time.perf_counter() - welcome.time

    def start(self, front) -> None:
        """Deliver to `front` (engine/ipc/transport.py CoreFront) from now on."""
        self._front = front
        self._io = threading.Thread(target=self._io_loop, name=f"roseplay-{self.label}-io",
                                    daemon=True)
        self._io.start()
        self._attach.start()
        if self._snap_bytes is None:
            self.wait_idle(30.0)

    # -- CoreTransport (any thread) -----------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.closed or self.fatal_error is not None

    def pack(self, msg) -> bytes:
        """`msg` encoded: a value the codec refuses, or a request over the engine's message
        limit, is InvalidRequestError before anything is sent."""
        try:
            data = P.encoder.encode(msg)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            raise InvalidRequestError(f"request cannot be sent to the engine: {exc}") from None
        if len(data) > self._max_message:     # never reached by a checked request
            raise InvalidRequestError(f"request of {len(data)} bytes is over the engine's "
                                      f"message limit ({self._max_message} bytes)")
        return data

    def send_packed(self, data: bytes) -> None:
        with self._send_lock:
            self._in.send(data, copy=False)

    def send(self, msg) -> None:
        if not self.closed:       # after close every command is a no-op (EngineAPI)
            self.send_packed(P.encoder.encode(msg))

    def step_once(self) -> threading.Event:
        token, event, _ = self._waiter()
        self.send(StepOnce(token))
        return event

    def wait_idle(self, timeout: float | None = None) -> bool:
        token, event, box = self._waiter()
        self.send(Barrier(token))
        ok = event.wait(timeout)
        if ok and box:
            self._snap_bytes = box[0]
        return ok and self.fatal_error is None and (bool(box) or self.closed)

    def watch(self, on: bool) -> None:
        """Take (or drop) the periodic snapshots: the engine builds none while no client
        subscribes. The IO thread owns the socket and applies this within 0.1 s."""
        self._want_snapshots = bool(on)

    def engine_stats(self) -> EngineStats:
        """The engine's latest gauges and counters (sent to every client, at most 20 Hz
        while it steps, and when it goes idle)."""
        return self._stats

    def snapshot(self) -> EngineSnapshot:
        raw, cached = self._snap_cache
        latest = self._snap_bytes
        if latest is not None and latest is not raw:
            cached = P.decode_snapshot(latest)
            self._snap_cache = (latest, cached)
            if self._front is not None:     # (another client may have changed them)
                self._front.engine_state(cached.knobs, cached.paused)
        return cached

    @property
    def unavailable(self) -> str | None:
        """Why requests cannot be served now (the engine is gone, or this client is
        attaching again), else None."""
        if self.stopped:
            return self.fatal_error or "engine client closed"
        detached = self._attach.detached
        return f"attaching to the engine again ({detached})" if detached else None

    def draining(self, seconds: float) -> None:
        if self.proc is not None:      # the owner's (attached to another's: not ours to say)
            self.send(P.Draining(seconds, self._owner_token))

    def close(self, timeout: float) -> None:
        if self.closed:
            return
        self.closed = True
        self._attach.stop()
        try:
            self.send_packed(P.encoder.encode(
                P.Shutdown(self._owner_token) if self.proc is not None else P.Bye()))
        except Exception:
            pass
        if self.proc is not None and self.fatal_error is None:   # (gone: no wait)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._reap()
        if self._front is not None:
            self._io.join(timeout)
            self._front.stopped(None)
        self._attach.join(timeout)
        self._close_sockets()

    def die(self, message: str) -> None:
        """The engine is gone (any thread): every request and waiter ends with `message`."""
        self.fatal_error = message
        self._attach.stop()
        self._front.stopped(message)
        self._release_waiters()

    # -- the IO thread ----------------------------------------------------------------
    def _waiter(self) -> tuple[int, threading.Event, list]:
        token = next(self._tokens)
        event, box = threading.Event(), []
        self._waiters[token] = (event, box)
        if self.stopped:
            event.set()
        return token, event, box

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._out, zmq.POLLIN)
        if self._sub is not None:
            poller.register(self._sub, zmq.POLLIN)
        watching = True
        while not self.stopped:
            if self._sub is not None and self._want_snapshots != watching:
                watching = self._want_snapshots
                self._sub.setsockopt(zmq.SUBSCRIBE if watching else zmq.UNSUBSCRIBE, self._topic)
            try:
                ready = dict(poller.poll(100))
            except zmq.ZMQError:
                break
            if self._sub is not None and self._sub in ready:
                self._snap_bytes = self._recv_snapshot()
                self._attach.silence.heard()
            if self._out in ready:
                self._drain_out()
            self._check_alive()                  # after reading what was queued
        self._reap_exited()

    def _reap_exited(self) -> None:
        """The engine stopped on its own (Fatal, or silence): collect its exit status as
        soon as it exits, so that no zombie remains while this client lives on; close()
        ends the wait (and stops a process that never exits)."""
        while self.proc is not None and not self.closed and self.proc.poll() is None:
            time.sleep(REAP_POLL_S)

    def _recv_snapshot(self) -> memoryview:
        return memoryview(self._sub.recv())[len(self._topic):]    # past the topic

    def _drain_out(self) -> None:
        while True:
            try:
                msg = P.core_decoder.decode(self._out.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._attach.silence.heard()
            if isinstance(msg, StepOutput):
                self._front.output(msg)
            elif isinstance(msg, P.Stats):
                self._stats = msg.stats
            elif isinstance(msg, (P.StepDone, P.BarrierDone)):
                event, box = self._waiters.pop(msg.token, (None, None))
                if event is not None:
                    if isinstance(msg, P.BarrierDone):
                        box.append(msg.snapshot)
                    event.set()
            elif isinstance(msg, P.Detached):
                self._detached(msg.message)
            elif isinstance(msg, P.Welcome):
                if self._attach.detached is not None:     # attached again
                    self._front.engine_state(msg.knobs, msg.paused)
                    self._clock(msg)
                self._attach.welcomed()
            elif isinstance(msg, P.Fatal):
                self.die(msg.message)

    def _detached(self, why: str) -> None:
        """The engine dropped us (or never heard our Hello): every request and waiter
        sent before our new Hello ends with an error (the engine ended it, or never
        applied it); what is submitted after the Hello is served."""
        if self._attach.detach(why):
            self._front.detached(why, lambda: self.send(P.Hello(self.label[:P.MAX_LABEL_CHARS])))
            self._release_waiters()

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and not self.closed:
            self.die(f"engine process died (exit code {self.proc.returncode})")
        elif self._attach.engine_silent() and not self.closed:
            self.die(f"the engine at {self.address} sent nothing for "
                     f"{self._attach.silence.timeout:g} s (client_timeout)")

    def _release_waiters(self) -> None:
        """Wake every wait_idle / step_once caller: their answers will not come."""
        waiters, self._waiters = self._waiters, {}
        for event, _ in waiters.values():
            event.set()

    def _reap(self) -> None:
        stop_engine(self.proc, self._tmpdir, self._launch_address)
        self._tmpdir = None

    def _close_sockets(self) -> None:
        with self._send_lock:         # not while another thread sends on one
            for name in ("_in", "_out", "_sub"):
                sock = getattr(self, name, None)
                if sock is not None:
                    sock.close(0)
        self._ctx.term()

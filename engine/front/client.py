"""EngineClient: EngineAPI (engine/front/api.py) for an engine core in another process.

`EngineClient(model=...)` starts the engine-core process (engine/ipc/core_proc.py) and
owns it; `EngineClient(connect="tcp://127.0.0.1:PORT")` attaches to one that another
process (a bench, a server) started and leaves it serving on close. Either way the
front runs here: tokenizing and validation (InputProcessor), detokenizing, stop strings
and stream events (OutputProcessor) happen in this process, off the engine's GIL. One
IO thread receives step outputs (one message per step for all of this client's
requests), engine stats and snapshots (conflated: only the newest is kept, decoded when
read). Attaching needs the engine key (engine/ipc/auth.py, curve.py); heartbeats, the
engine's silence and attaching again after the engine dropped this client are
engine/front/attach.py's.
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

from engine.front.api import CLOSE_TIMEOUT, EngineStopped
from engine.front.attach import Attachment, EngineKeyRefused, handshake, open_socket
from engine.codes import ENGINE_CLOSED, REASON_CANCELLED, REASON_ERROR
from engine.config import InvalidRequestError, SchedulerConfig, knob_changes
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.ipc.launch import EngineDied, EngineLaunch, stop_engine, wait_ready
from engine.front.stream import RequestStream, chain_sinks
from engine.outputs import EngineInfo
from engine.front.processor import InputProcessor, OutputProcessor, StreamEvent, check_request_id
from engine.request import SamplingParams
from engine.snapshot import EngineSnapshot
from engine.engine_stats import EngineStats
from engine.tokenizer import load_tokenizer

STARTUP_TIMEOUT = 900.0
__all__ = ["EngineClient", "EngineDied", "EngineKeyRefused"]


class EngineClient:
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
        self.label = label
        self.snapshots = snapshots
        self._want_snapshots = True
        self.proc = None
        self._tmpdir = self._launch_address = None
        self.fatal_error: str | None = None
        self._closed = False
        self.tokenizer = None
        if connect is None:
            launch = launch or EngineLaunch(engine_kwargs, address, engine_key)   # bad knobs:
            self.proc, self._tmpdir = launch.proc, launch.tmpdir                # refused here
            self._launch_address = launch.address
            self._engine_key = launch.engine_key
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
            self._engine_key = auth.read_key(connect, engine_key) or ""
        self.address = connect or address
        self._topic = auth.snapshot_topic(self._engine_key)
        self._stats = EngineStats()
        self._ctx = zmq.Context()
        self._send_lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._waiters: dict[int, tuple[threading.Event, list]] = {}
        self._snap_bytes: bytes | None = None
        self._snap_cache: tuple[bytes | None, EngineSnapshot | None] = (None, None)
        self._connect(startup_timeout if connect else 30.0)
        self._io = threading.Thread(target=self._io_loop, name=f"roseplay-{label}-io", daemon=True)
        self._io.start()
        self._attach.start()
        if self._snap_bytes is None:
            self.wait_idle(30.0)

    # -- start-up ------------------------------------------------------------------------
    def _connect(self, timeout: float) -> None:
        _, out_ep, pub_ep = P.endpoints(self.address)
        ident = f"{self.label}-{uuid.uuid4().hex[:8]}".encode()
        key = self._engine_key
        self._in = open_socket(self._ctx, zmq.DEALER, None, key, ident)   # handshake() connects
        self._out = open_socket(self._ctx, zmq.DEALER, out_ep, key, ident)
        self._sub = open_socket(self._ctx, zmq.SUB, pub_ep, key, topic=self._topic) \
            if self.snapshots else None
        try:
            welcome = handshake(self._in, self._out, self.label, self.address, timeout,
                                lambda: self.proc is None or self.proc.poll() is None)
        except BaseException:
            self._close_sockets()
            raise
        self._attach = Attachment(self._send, self.label, welcome.client_timeout)
        deadline = time.monotonic() + 10.0      # the first snapshot: snapshot() is never None
        while self._sub is not None and self._snap_bytes is None and time.monotonic() < deadline:
            if self._sub.poll(100):
                self._snap_bytes = self._recv_snapshot()
        self.info: EngineInfo = welcome.info
        self._knobs: SchedulerConfig = welcome.knobs
        self._paused = welcome.paused
        if self.proc is None:     # attached: the engine says which model it serves
            self.tokenizer = load_tokenizer(self.info.model_name)
        i = self.info
        self.inputs = InputProcessor(self.tokenizer, i.model_name, i.vocab_size, i.max_model_len,
                                     i.num_blocks, i.block_size)
        self.outputs = OutputProcessor(self.tokenizer)
        self._submit_lock = threading.Lock()
        self._max_message = P.max_message_bytes(i.max_model_len)   # the engine's MAXMSGSIZE

    # -- the client API (any thread) -------------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig:
        return self._knobs

    @property
    def paused(self) -> bool:
        return self._paused

    def submit(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None,
               priority: int = 0) -> RequestStream:
        """EngineAPI.submit; callbacks run on this client's IO thread."""
        self._check_running()
        creq, text = self.inputs.process(prompt, params, request_id, priority)
        try:      # encoded before any state exists: a value the codec refuses leaves none
            data = P.encoder.encode(P.Submit(
                creq.request_id, list(creq.prompt_token_ids), creq.params,
                creq.arrival_time, creq.prompt_preview, creq.priority))
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            raise InvalidRequestError(f"request cannot be sent to the engine: {exc}") from None
        if len(data) > self._max_message:     # never reached by a checked request
            raise InvalidRequestError(f"request of {len(data)} bytes is over the engine's "
                                      f"message limit ({self._max_message} bytes)")
        stream = RequestStream(creq.request_id, self._cancel_dropped)
        on_event, on_finish = chain_sinks(stream, on_event, on_finish)
        with self._submit_lock:
            if self.outputs.has(creq.request_id):
                stream.detach()      # dropping it must not cancel the live request of that id
                raise InvalidRequestError(f"duplicate request id {creq.request_id!r}")
            self.outputs.add(creq, text, on_event, on_finish)
            try:
                self._send_bytes(data)
            except BaseException:
                stream.detach()
                self.outputs.states.pop(creq.request_id, None)   # never sent: no state
                raise
        return stream

    def cancel(self, request_id: str) -> None:
        """Safe for any value: an id no request can have is nothing to cancel."""
        try:
            request_id = check_request_id(request_id)
        except InvalidRequestError:
            return
        self._send(P.Abort(request_id, REASON_CANCELLED))

    def set_knobs(self, **changes) -> SchedulerConfig:
        """Validate now; the core applies only `changes` to its own knobs at the next step
        (this client's view may be a snapshot behind another client's change: sending
        whole knobs from it could undo that change)."""
        knobs = self._knobs = self._knobs.replace(**changes)
        self._send(P.SetKnobs(knob_changes(**changes)))
        return knobs

    def clear_prefix_cache(self) -> None:
        self._send(P.ClearPrefixCache())

    def reset_peak_usage(self) -> None:
        self._send(P.ResetPeakUsage())

    def pause(self) -> None:
        self._paused = True
        self._send(P.SetPaused(True))

    def resume(self) -> None:
        self._paused = False
        self._send(P.SetPaused(False))

    def step_once(self) -> threading.Event:
        self._paused = True
        token, event, _ = self._waiter()
        self._send(P.StepOnce(token))
        return event

    def watch(self, on: bool) -> None:
        """Take (or drop) the periodic snapshots: the engine builds none while no client
        subscribes. The I/O thread owns the socket and applies this within 0.1 s."""
        self._want_snapshots = bool(on)

    def engine_stats(self) -> EngineStats:
        """The engine's latest gauges and counters (sent to every client, at most 20 Hz
        while it steps, and when it goes idle): what /metrics serves."""
        return self._stats

    def snapshot(self) -> EngineSnapshot:
        raw, cached = self._snap_cache
        latest = self._snap_bytes
        if latest is not None and latest is not raw:
            cached = P.decode_snapshot(latest)
            self._snap_cache = (latest, cached)
            self._knobs, self._paused = cached.knobs, cached.paused
        return cached

    def wait_idle(self, timeout: float | None = None) -> bool:
        token, event, box = self._waiter()
        self._send(P.Barrier(token))
        ok = event.wait(timeout)
        if ok and box:
            self._snap_bytes = box[0]
        return ok and self.fatal_error is None and (bool(box) or self._closed)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        if self._closed:
            return
        self._closed = True
        self._attach.stop()
        try:
            self._send_bytes(P.encoder.encode(
                P.Shutdown(self._owner_token) if self.proc is not None else P.Bye()))
        except Exception:
            pass
        if self.proc is not None and self.fatal_error is None:   # (gone: no wait)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._reap()
        self._io.join(timeout)
        self._attach.join(timeout)
        self.outputs.fail_all(REASON_CANCELLED, ENGINE_CLOSED)
        self._close_sockets()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------
    def _send(self, msg) -> None:
        if not self._closed:       # after close every command is a no-op (EngineAPI)
            self._send_bytes(P.encoder.encode(msg))

    def _send_bytes(self, data: bytes) -> None:
        with self._send_lock:
            self._in.send(data, copy=False)

    def _check_running(self) -> None:
        if self._closed or self.fatal_error:
            raise EngineStopped(f"engine is stopped ({self.fatal_error or 'closed'})")

    def _cancel_dropped(self, request_id: str) -> None:
        if not self._closed and not self.fatal_error:
            self._send(P.Abort(request_id, REASON_CANCELLED, "stream dropped by its consumer"))

    def _waiter(self) -> tuple[int, threading.Event, list]:
        token = next(self._tokens)
        event, box = threading.Event(), []
        self._waiters[token] = (event, box)
        if self.fatal_error or self._closed:
            event.set()
        return token, event, box

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._out, zmq.POLLIN)
        if self._sub is not None:
            poller.register(self._sub, zmq.POLLIN)
        watching = True
        while not self._closed and self.fatal_error is None:
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

    def _recv_snapshot(self) -> memoryview:
        return memoryview(self._sub.recv())[len(self._topic):]    # past the topic

    def _drain_out(self) -> None:
        while True:
            try:
                msg = P.core_decoder.decode(self._out.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._attach.silence.heard()
            if isinstance(msg, P.Stats):
                self._stats = msg.stats
            elif isinstance(msg, P.Outputs):
                for rid in self.outputs.process(msg):      # stop strings matched
                    self._send(P.Abort(rid, "stop"))
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
                    self._knobs, self._paused = msg.knobs, msg.paused
                self._attach.welcomed()
            elif isinstance(msg, P.Fatal):
                self._die(msg.message)

    def _detached(self, why: str) -> None:
        """The engine dropped us (or never heard our Hello): every request and waiter
        sent before our new Hello ends with an error (the engine ended it, or never
        applied it); what is submitted after the Hello is served."""
        if not self._attach.detach(why):
            return
        with self._submit_lock:       # no Submit between the list and the Hello
            sent = list(self.outputs.states)
            self._send(P.Hello(self.label[:P.MAX_LABEL_CHARS]))
        for rid in sent:
            self.outputs.fail(rid, REASON_ERROR, why)
        self._release_waiters()

    @property
    def unavailable(self) -> str | None:
        """Why requests cannot be served now (the engine is gone, or this client is
        attaching again), else None: what /health reports."""
        if self.fatal_error or self._closed:
            return self.fatal_error or "engine client closed"
        detached = self._attach.detached
        return f"attaching to the engine again ({detached})" if detached else None

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and not self._closed:
            self._die(f"engine process died (exit code {self.proc.returncode})")
        elif self._attach.engine_silent() and not self._closed:
            self._die(f"the engine at {self.address} sent nothing for "
                      f"{self._attach.silence.timeout:g} s (client_timeout)")

    def _die(self, message: str) -> None:
        self.fatal_error = message
        self._attach.stop()
        self.outputs.fail_all(REASON_ERROR, message)
        self._release_waiters()

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

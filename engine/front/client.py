"""EngineClient: EngineAPI (engine/front/api.py) over a CoreTransport (engine/ipc/transport.py).

The front runs here, whichever transport carries its messages: tokenizing and validation
(InputProcessor), the table of live requests, detokenizing, stop strings and stream
events (OutputProcessor), and the caller's view of the live knobs. It sends the core's
own requests and commands (engine/outputs.py, engine/commands.py) and gets its
StepOutputs back.

`EngineClient(model=...)` starts an engine-core process and owns it;
`EngineClient(connect="tcp://127.0.0.1:PORT")` attaches to one that another process
started (both: ZmqTransport, engine/ipc/zmq_transport.py). `EngineClient(transport)`
takes any transport; EngineLoop (engine/front/loop.py) is the one over an engine on a
thread of this process (InprocTransport). Callbacks run on the transport's thread (the
engine thread in process, the IO thread over ZMQ).
"""
from __future__ import annotations

import threading
from typing import Callable

from engine.codes import ENGINE_CLOSED, REASON_CANCELLED, REASON_ERROR, REASON_STOP
from engine.commands import Abort, SetKnobs, SetPaused
from engine.config import InvalidRequestError, KnobChanges, SchedulerConfig
from engine.engine_stats import EngineStats
from engine.front.api import CLOSE_TIMEOUT, CoreControls, EngineStopped
from engine.front.processor import InputProcessor, OutputProcessor, StreamEvent, check_request_id
from engine.front.stream import RequestStream, chain_sinks
from engine.ipc.attach import EngineKeyRefused
from engine.ipc.launch import EngineDied
from engine.ipc.transport import CoreTransport
from engine.ipc.zmq_transport import STARTUP_TIMEOUT, ZmqTransport
from engine.outputs import StepOutput
from engine.request import SamplingParams
from engine.snapshot import EngineSnapshot

__all__ = ["EngineClient", "EngineDied", "EngineKeyRefused", "STARTUP_TIMEOUT"]


class EngineClient(CoreControls):
    def __init__(self, transport: CoreTransport | None = None, **kwargs):
        """transport: None starts (or, with connect=, attaches to) an engine process:
        ZmqTransport(**kwargs)."""
        self.transport = t = transport if transport is not None else ZmqTransport(**kwargs)
        self.info, self.tokenizer = t.info, t.tokenizer
        self.inputs = InputProcessor.of(self.tokenizer, self.info)
        self.outputs = OutputProcessor(self.tokenizer)
        self._knobs: SchedulerConfig = t.knobs     # the front's one copy of the live knobs
        self._paused = t.paused
        self._closed = False
        self._submit_lock = threading.Lock()
        self._knobs_lock = threading.Lock()
        t.start(self)

    # -- EngineAPI (any thread) ---------------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig:
        """The live knobs as this client last set or saw them (applied at the next step)."""
        return self._knobs

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def fatal_error(self) -> str | None:
        return self.transport.fatal_error

    @property
    def unavailable(self) -> str | None:
        """Why requests cannot be served now (the engine is gone, or this client is
        attaching again), else None: what /health reports."""
        return self.transport.unavailable

    @property
    def address(self) -> str | None:
        """The engine process's address (None in process)."""
        return self.transport.address

    @property
    def proc(self):
        """The engine process this client owns, else None."""
        return self.transport.proc

    def submit(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None,
               priority: int = 0) -> RequestStream:
        """EngineAPI.submit. `priority` orders the queue under scheduling_policy=priority
        (lower first, as vLLM). Callbacks run on the transport's thread (an asyncio
        server forwards them with call_soon_threadsafe)."""
        self._check_running()
        creq, text = self.inputs.process(prompt, params, request_id, priority)
        packed = self.transport.pack(creq)    # a value the wire refuses leaves no state
        stream = RequestStream(creq.request_id, self.cancel, self._cancel_dropped)
        on_event, on_finish = chain_sinks(stream, on_event, on_finish)
        with self._submit_lock:       # the front's table is the one place ids are live
            if self.outputs.has(creq.request_id):
                stream.detach()       # dropping it must not cancel the live request
                raise InvalidRequestError(f"duplicate request id {creq.request_id!r}")
            self.outputs.add(creq, text, on_event, on_finish)
            try:
                self.transport.send_packed(packed)
            except BaseException:
                stream.detach()
                self.outputs.states.pop(creq.request_id, None)   # never sent: no state
                raise
        if self.transport.stopped:    # stopped meanwhile: its end may already have passed
            self.outputs.fail(creq.request_id, REASON_CANCELLED, ENGINE_CLOSED)
            self._check_running()
        return stream

    def cancel(self, request_id: str) -> None:
        """Safe for any value: an id no request can have is nothing to cancel."""
        try:
            request_id = check_request_id(request_id)
        except InvalidRequestError:
            return
        self.transport.send(Abort(request_id, REASON_CANCELLED))

    def set_knobs(self, **changes) -> SchedulerConfig:
        """Validated here, once on this side (InvalidRequestError); the core applies only
        `changes` at its next step (this client's view may be a snapshot behind another
        client's change: sending whole knobs from it could undo that change)."""
        with self._knobs_lock:        # concurrent callers: no update is lost
            knobs = self._knobs = self._knobs.replace(**changes)
            self.transport.send(SetKnobs(KnobChanges(**changes)))
        return knobs

    def send_command(self, cmd) -> None:
        """CoreControls: a command to this client's engine (a no-op after close)."""
        self.transport.send(cmd)

    def pause(self) -> None:
        self._paused = True
        self.transport.send(SetPaused(True))

    def resume(self) -> None:
        self._paused = False
        self.transport.send(SetPaused(False))

    def step_once(self) -> threading.Event:
        """Pause (if running) and run exactly one engine step; the event fires after it."""
        self._paused = True
        return self.transport.step_once()

    def watch(self, on: bool) -> None:
        """Take (or drop) the periodic snapshots: the engine builds none while nobody
        watches (then one when it goes idle, pauses or single-steps)."""
        self.transport.watch(on)

    def engine_stats(self) -> EngineStats:
        """The engine's latest gauges and counters: what /metrics serves."""
        return self.transport.engine_stats()

    def snapshot(self) -> EngineSnapshot:
        return self.transport.snapshot()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """EngineAPI.wait_idle: no step to run (a pause, any client's, leaves requests
        unfinished) and no command pending."""
        return self.transport.wait_idle(timeout)

    def draining(self, seconds: float) -> None:
        self.transport.draining(seconds)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        if self._closed:
            return
        self._closed = True
        self.transport.close(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- CoreFront: the transport's calls (its thread) ---------------------------------
    def output(self, out: StepOutput) -> None:
        for rid in self.outputs.process(out):     # stop strings matched: end them now
            self.transport.send(Abort(rid, REASON_STOP))

    def engine_state(self, knobs: SchedulerConfig, paused: bool) -> None:
        self._knobs, self._paused = knobs, paused

    def detached(self, why: str, hello: Callable[[], None]) -> None:
        with self._submit_lock:       # no request between the list and the Hello
            sent = list(self.outputs.states)
            hello()
        for rid in sent:
            self.outputs.fail(rid, REASON_ERROR, why)

    def stopped(self, error: str | None) -> None:
        self.outputs.fail_all(REASON_ERROR if error else REASON_CANCELLED,
                              error or ENGINE_CLOSED)

    # -- internals -------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._closed or self.transport.stopped:
            raise EngineStopped(f"engine is stopped ({self.fatal_error or 'closed'})")

    def _cancel_dropped(self, request_id: str) -> None:
        if not self._closed and not self.transport.stopped:
            self.transport.send(Abort(request_id, REASON_CANCELLED,
                                      "stream dropped by its consumer"))

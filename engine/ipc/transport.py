"""CoreTransport: how a front (engine/front/client.py EngineClient) reaches an engine core.

Two implementations carry the same messages (engine/outputs.py's CoreRequest and
StepOutput, engine/commands.py's commands): InprocTransport (engine/ipc/inproc.py: the
CoreLoop on a thread of this process) and ZmqTransport (engine/ipc/zmq_transport.py: the
core in its own process). A transport delivers to a `CoreFront`: the front's side of
the seam, which owns the text, the request table and the caller-facing state.
"""
from __future__ import annotations

import threading
from typing import Callable, Protocol

from engine.config import SchedulerConfig
from engine.engine_stats import EngineStats
from engine.outputs import EngineInfo, StepOutput
from engine.snapshot import EngineSnapshot


class CoreFront(Protocol):
    """What a transport calls back (on its own thread: the core's or the IO thread)."""

    def output(self, out: StepOutput) -> None:
        """One step's outputs for this front's requests."""

    def engine_state(self, knobs: SchedulerConfig, paused: bool) -> None:
        """The engine's knobs and pause as it last reported them (another client's
        change included)."""

    def detached(self, why: str, hello: Callable[[], None]) -> None:
        """The engine dropped this client: end what was sent, then call hello() (with no
        request sent between) to attach again."""

    def stopped(self, error: str | None) -> None:
        """Nothing more comes: end every request (error: why the engine stopped on its
        own; None: closed). The transport's last call."""


class CoreTransport(Protocol):
    info: EngineInfo
    tokenizer: object
    knobs: SchedulerConfig          # the engine's at start (the front keeps them after)
    paused: bool
    fatal_error: str | None
    address: str | None             # the engine process's (None in process)
    proc: object                    # the engine process this transport owns, else None

    @property
    def stopped(self) -> bool:
        """Closed, or the engine stopped: nothing sent is served any more."""

    @property
    def unavailable(self) -> str | None:
        """Why requests cannot be served now, else None."""

    def start(self, front: CoreFront) -> None: ...

    def pack(self, msg) -> object:
        """`msg` ready to send (InvalidRequestError if the transport cannot carry it)."""

    def send_packed(self, packed) -> None: ...

    def send(self, msg) -> None:
        """Send a request or command (a no-op once closed)."""

    def step_once(self) -> threading.Event: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...

    def watch(self, on: bool) -> None: ...

    def snapshot(self) -> EngineSnapshot: ...

    def engine_stats(self) -> EngineStats: ...

    def draining(self, seconds: float) -> None:
        """Tell an engine process this transport owns that its owner drains (else nothing)."""

    def close(self, timeout: float) -> None: ...

"""EngineAPI: the one client API of the engine, whichever transport carries it.

One class implements it over either transport: EngineClient (engine/front/client.py) with
the core in its own process (over ZMQ), and EngineLoop (engine/front/loop.py), the same
client with the core loop on a thread of this process; DPClient (engine/front/dp_client.py)
implements it over several engine processes. The TUI, the bench, the server and LLM-style
callers use only what is declared here, and tests/engine/front/test_engine_contract.py
runs one suite against both transports. The behaviour is settled here, once:

- a request id that a live request of this client holds: `submit` raises
  InvalidRequestError (as vLLM does), before any state exists; the live request is
  untouched, and the id is free again once that request has ended;
- bad input (prompt, SamplingParams, priority, knobs): InvalidRequestError from the
  call, naming the field; nothing is queued;
- `submit` after `close()` or after the engine died: EngineStopped; any other call
  after `close()` is a harmless no-op (step_once's event is set, wait_idle is True);
- `cancel(id)` ends the request with one final event, finish_reason "cancelled" and no
  error; dropping a stream unread cancels it the same way (error "stream dropped by its
  consumer"); `close()` ends every live request with finish_reason "cancelled" and
  error "engine closed" (engine.codes.ENGINE_CLOSED);
- `close()` is idempotent and waits at most CLOSE_TIMEOUT seconds for each part;
- `info` is an EngineInfo with the same fields on both; `watch()` exists on both.
"""
from __future__ import annotations

import threading
from typing import Callable, Protocol, runtime_checkable

from engine.commands import ResetPeakUsage, ResetPrefixCache
from engine.config import SchedulerConfig
from engine.outputs import EngineInfo
from engine.front.processor import StreamEvent
from engine.request import SamplingParams
from engine.snapshot import EngineSnapshot
from engine.engine_stats import EngineStats
from engine.front.stream import RequestStream

CLOSE_TIMEOUT = 10.0   # seconds close() waits for the engine thread or process to end


class CoreControls:
    """The controls that are one command to the core and keep no state in the front: each
    sends its command (engine/commands.py) through `send_command` (EngineClient: to its
    engine; DPClient: to every live replica). A new such control is a method here (and
    its line in EngineAPI), its Struct in engine/commands.py and its case in
    CoreLoop.handle (engine/core/core_loop.py)."""

    def send_command(self, cmd) -> None:
        raise NotImplementedError

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's reset_prefix_cache); running requests keep
        their blocks."""
        self.send_command(ResetPrefixCache())

    def reset_peak_usage(self) -> None:
        """Restart the peak-KV-usage watermark (EngineSnapshot.peak_used_blocks)."""
        self.send_command(ResetPeakUsage())


class EngineStopped(RuntimeError):
    """The engine was closed, or died: it takes no more calls."""


@runtime_checkable
class EngineAPI(Protocol):
    info: EngineInfo
    tokenizer: object      # the model's tokenizer (None for a model without one)

    @property
    def knobs(self) -> SchedulerConfig:
        """The live knobs as this client last set or saw them."""

    @property
    def paused(self) -> bool: ...

    @property
    def fatal_error(self) -> str | None:
        """Why the engine stopped on its own (None while it serves, or after close())."""

    def submit(self, prompt, params: SamplingParams | None = None,
               request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None,
               priority: int = 0) -> RequestStream:
        """Validate and queue a request (InvalidRequestError for bad input or a live
        duplicate id). Sinks: by default every step's delta queues for the returned
        stream; `on_event` gets every event instead; `on_finish` alone gets only the
        final one. Callbacks run on the engine's (or the client's IO) thread: keep them
        cheap. Dropping the returned stream before the request ends cancels it."""

    def cancel(self, request_id: str) -> None:
        """End a request of this client (any value is safe: an unknown id is a no-op)."""

    def set_knobs(self, **changes) -> SchedulerConfig:
        """Validate now (InvalidRequestError); the engine applies only the changed
        fields before its next step. Returns the knobs as this client now sees them."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def step_once(self) -> threading.Event:
        """Pause (if running) and run exactly one step; the event fires after it."""

    def reset_prefix_cache(self) -> None: ...      # (CoreControls: one command each)

    def reset_peak_usage(self) -> None: ...

    def snapshot(self) -> EngineSnapshot:
        """The latest published view; current after wait_idle() returned True."""

    def engine_stats(self) -> EngineStats:
        """The latest gauges and counters (what /metrics serves)."""

    def watch(self, on: bool) -> None:
        """Take (or drop) the periodic snapshots; without them snapshot() is the one
        published when the engine last went idle or paused."""

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the engine has no step to run and no command sent before is
        pending; snapshot() is then current. Idle is not "every request finished": a
        pause, any client's, leaves its requests unfinished and the engine idle (a
        caller inspects them, or attaches, while paused). False on timeout or if the
        engine died."""

    def draining(self, seconds: float) -> None:
        """This owner drains its open requests for up to `seconds`, then closes: an
        engine process that gets SIGTERM with it serves the drain (engine/ipc/core_proc.py)."""

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop (or, attached to another's engine, leave) it; idempotent."""

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...

"""EngineLoop: the engine on a background thread, behind the client API.

It implements EngineAPI (engine/front/api.py: the calls, and how each behaves, defined once),
as the engine-process client (engine/front/client.py) does. Here the core loop
(engine/core/core_loop.py) runs on a thread of this process, and its step outputs go through
the front's OutputProcessor on that thread.
"""
from __future__ import annotations

import threading
from typing import Callable

from engine.front.api import CLOSE_TIMEOUT, EngineStopped
from engine.codes import ENGINE_CLOSED, REASON_CANCELLED, REASON_ERROR, REASON_STOP
from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig, make_config
from engine.ipc.inproc import CoreLoop, LLMEngine
from engine.outputs import EngineInfo
from engine.front.processor import InputProcessor, OutputProcessor, StreamEvent, check_request_id
from engine.front.stream import RequestStream, chain_sinks
from engine.request import SamplingParams
from engine.snapshot import EngineSnapshot
from engine.engine_stats import EngineStats

__all__ = ["EngineLoop", "RequestStream", "StreamEvent", "EngineInfo"]


class EngineLoop:
    def __init__(self, engine: LLMEngine | None = None, *, config: EngineConfig | None = None,
                 snapshot_interval: float = 0.02, start: bool = True, **kwargs):
        if engine is None:
            config = config or make_config(**kwargs)
            config.check_in_process()
        self.engine = engine or LLMEngine(config)
        e = self.engine
        self.info = EngineInfo.of(e)
        self.tokenizer = e.tokenizer
        self.inputs = InputProcessor.for_engine(e)
        self.outputs = OutputProcessor(e.tokenizer)
        self._knobs = e.knobs
        self._knobs_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self.core = CoreLoop(e, self._on_output, snapshot_interval)
        self._thread = threading.Thread(target=self._run, name="roseplay-engine", daemon=True)
        if start:
            self._thread.start()

    # -- the client API (any thread) ---------------------------------------------------
    @property
    def knobs(self):
        """The latest requested live knobs (applied at the next step)."""
        return self._knobs

    @property
    def fatal_error(self) -> str | None:
        return self.core.fatal_error

    @property
    def paused(self) -> bool:
        return self.core.paused

    def submit(self, prompt, params: SamplingParams | None = None,
               request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None,
               priority: int = 0) -> RequestStream:
        """EngineAPI.submit. `priority` orders the queue under scheduling_policy=priority
        (lower first, as vLLM). Callbacks run on the engine thread (an asyncio server
        forwards them with call_soon_threadsafe)."""
        self._check_running()
        creq, text = self.inputs.process(prompt, params, request_id, priority)
        stream = RequestStream(creq.request_id, self._cancel_dropped)
        on_event, on_finish = chain_sinks(stream, on_event, on_finish)
        with self._submit_lock:       # the front's table is the one place ids are live
            if self.outputs.has(creq.request_id):
                stream.detach()       # dropping it must not cancel the live request
                raise InvalidRequestError(f"duplicate request id {creq.request_id!r}")
            self.outputs.add(creq, text, on_event, on_finish)
            self.core.add(creq)
        if self.core.stopped:         # closed meanwhile: its end may already have passed
            self.outputs.fail(creq.request_id, REASON_CANCELLED, ENGINE_CLOSED)
            self._check_running()
        return stream

    def cancel(self, request_id: str) -> None:
        """Safe for any value: an id no request can have is nothing to cancel."""
        try:
            request_id = check_request_id(request_id)
        except InvalidRequestError:
            return
        self.core.abort(request_id, REASON_CANCELLED)

    def set_knobs(self, **changes) -> SchedulerConfig:
        """EngineAPI.set_knobs: only `changes` are applied, as over the wire."""
        with self._knobs_lock:      # concurrent callers: no update is lost
            knobs = self._knobs = self._knobs.replace(**changes)
            self.core.update_knobs(changes)
        return knobs

    def clear_prefix_cache(self) -> None:
        self.core.clear_prefix_cache()

    def pause(self) -> None:
        self.core.set_paused(True)

    def resume(self) -> None:
        self.core.set_paused(False)

    def step_once(self) -> threading.Event:
        """Pause (if running) and run exactly one engine step; the event fires after it."""
        done = threading.Event()
        self.core.step_once(done.set)
        return done

    def snapshot(self) -> EngineSnapshot:
        return self.core.snapshot()

    def engine_stats(self) -> EngineStats:
        """The latest gauges and counters (what /metrics serves; engine/core/stats.py)."""
        return self.core.stats

    def reset_peak_usage(self) -> None:
        self.core.reset_peak_usage()

    def watch(self, on: bool) -> None:
        """Take (or drop) the periodic snapshots: while dropped the engine thread builds
        one only when it goes idle, pauses or single-steps."""
        self.core.publish_snapshots = bool(on)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is unfinished and no command is pending."""
        return self.core.wait_idle(timeout) and self.fatal_error is None

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        self.core.stop()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> "EngineLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- engine thread -------------------------------------------------------------------
    def _check_running(self) -> None:
        if self.core.stopped:
            raise EngineStopped(f"engine is stopped ({self.fatal_error or 'closed'})")

    def _cancel_dropped(self, request_id: str) -> None:
        if not self.core.stopped:
            self.core.abort(request_id, REASON_CANCELLED, "stream dropped by its consumer")

    def _on_output(self, out) -> None:
        for rid in self.outputs.process(out):     # stop strings matched: end them now
            self.core._emit(self.engine.abort_output(rid, REASON_STOP))

    def _run(self) -> None:
        self.core.run()
        message = self.core.fatal_error or ENGINE_CLOSED
        self.outputs.fail_all(REASON_ERROR if self.core.fatal_error else REASON_CANCELLED,
                              message)

"""EngineLoop: the engine on a background thread, with streams, knobs and snapshots.

Any thread may submit, cancel, change knobs, pause, resume or single-step; those calls
queue a command that the engine thread applies before its next step, so a knob change
takes effect at the next step and nothing touches engine state concurrently. After a
step the engine thread pushes token deltas into per-request streams and (at most every
`snapshot_interval` seconds) swaps in a new immutable snapshot. Readers never block the
engine and the engine never waits for a reader.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from engine.config import EngineConfig, InvalidRequestError, make_config
from engine.core import LLMEngine
from engine.request import (CompletionOutput, Request, RequestMetrics, RequestOutput,
                            SamplingParams)
from engine.snapshot import EngineSnapshot


@dataclass(frozen=True)
class StreamEvent:
    """What one step added to a request: new tokens (with emit times) and text."""
    request_id: str
    token_ids: tuple[int, ...]
    token_times: tuple[float, ...]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    output: RequestOutput | None = None     # the whole result, on the final event


class _EventQueue(queue.SimpleQueue):
    """A stream's event sink. By default events queue for the RequestStream reader.
    `on_event` (if set) gets every event instead (nothing queues: e.g. an asyncio server
    forwards them with call_soon_threadsafe); `on_finish` (if set) also gets the final
    event. Both are called on the engine thread: they must be cheap."""
    on_finish: Callable[[StreamEvent], None] | None = None
    on_event: Callable[[StreamEvent], None] | None = None

    def put(self, event, block=True, timeout=None):
        if self.on_event is not None:
            _call(self.on_event, event)
        else:
            super().put(event)
        if event.finished and self.on_finish is not None:
            _call(self.on_finish, event)


def _call(callback, event) -> None:
    try:
        callback(event)
    except Exception:   # a consumer's bug must not stop the engine thread
        pass


@dataclass(frozen=True)
class EngineInfo:
    """What a client needs to know about the engine it talks to (fixed at start)."""
    model_name: str
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    device: str
    dtype: str
    backend: str


class RequestStream:
    """Iterate for StreamEvents; `result()` waits for the final RequestOutput.

    If the consumer drops its stream before the request ends, the request is cancelled.
    """

    def __init__(self, request_id: str, q: queue.SimpleQueue, loop: "EngineLoop"):
        self.request_id = request_id
        self._q = q
        self._loop = weakref.ref(loop)
        self.output: RequestOutput | None = None
        self._finalizer = weakref.finalize(self, EngineLoop._stream_dropped,
                                           weakref.ref(loop), request_id, q)

    def get(self, timeout: float | None = None) -> StreamEvent:
        event = self._q.get(timeout=timeout)
        if event.finished:   # refused/failed before it ran: a bare error output, never None
            self.output = event.output or RequestOutput(
                event.request_id, None, (), (CompletionOutput(0, "", (), event.finish_reason),),
                True, RequestMetrics.from_times(0.0, []), event.error)
            self._finalizer.detach()
        return event

    def __iter__(self) -> Iterator[StreamEvent]:
        while self.output is None:
            yield self.get()

    def result(self, timeout: float | None = None) -> RequestOutput:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.output is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.get(timeout=left)
        return self.output

    def cancel(self) -> None:
        loop = self._loop()
        if loop is not None:
            loop.cancel(self.request_id)


class EngineLoop:
    def __init__(self, engine: LLMEngine | None = None, *, config: EngineConfig | None = None,
                 snapshot_interval: float = 0.02, start: bool = True, **kwargs):
        self.engine = engine or LLMEngine(config or make_config(**kwargs))
        self.snapshot_interval = snapshot_interval
        self._commands: deque[Callable[[], None]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._sinks: dict[str, tuple[queue.SimpleQueue, list[int]]] = {}
        self._knobs = self.engine.knobs        # latest requested (validated) knobs
        self._paused = False
        self._single_steps: deque[threading.Event] = deque()
        self._stopped = False
        self.fatal_error: str | None = None
        self._snapshot = self.engine.snapshot()
        self._last_publish = 0.0
        self._thread = threading.Thread(target=self._run, name="roseplay-engine", daemon=True)
        if start:
            self._thread.start()

    # -- public API (any thread) ---------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        e = self.engine
        return EngineInfo(e.model_name, e.vocab_size, e.max_model_len, e.pool.num_blocks,
                          e.pool.block_size, str(e.device), str(e.dtype).removeprefix("torch."),
                          e.backend)

    @property
    def tokenizer(self):
        """The model's tokenizer (None for dummy models)."""
        return self.engine.tokenizer

    @property
    def knobs(self):
        """The latest requested live knobs (applied at the next step)."""
        return self._knobs

    def submit(self, prompt, params: SamplingParams | None = None,
               request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None) -> RequestStream:
        """Validate (raises InvalidRequestError here) and queue a request. `on_finish`
        gets the final StreamEvent on the engine thread (lets one consumer wait on many
        requests without polling their streams). `on_event` gets every event (token
        deltas and the final one) on the engine thread instead of the stream's queue."""
        if self._stopped:
            raise RuntimeError(f"engine loop is stopped ({self.fatal_error or 'closed'})")
        req = self.engine.make_request(prompt, params, request_id)
        q = _EventQueue()
        q.on_finish, q.on_event = on_finish, on_event
        stream = RequestStream(req.request_id, q, self)
        self._post(lambda: self._add(req, q))
        if self._stopped:   # closed meanwhile: the command may never run
            raise RuntimeError(f"engine loop is stopped ({self.fatal_error or 'closed'})")
        return stream

    def cancel(self, request_id: str) -> None:
        self._post(lambda: self._abort(request_id, "cancelled"))

    def set_knobs(self, **changes):
        """Validate now (raises InvalidRequestError), apply before the next step."""
        knobs = self._knobs = self._knobs.replace(**changes)
        self._post(lambda: self.engine.set_knobs(knobs))
        return knobs

    def clear_prefix_cache(self) -> None:
        self._post(self.engine.clear_prefix_cache)

    def pause(self) -> None:
        self._paused = True
        self._post(lambda: None)

    def resume(self) -> None:
        self._paused = False
        self._post(lambda: None)

    @property
    def paused(self) -> bool:
        return self._paused

    def step_once(self) -> threading.Event:
        """Pause (if running) and run exactly one engine step; the event fires after it."""
        done = threading.Event()
        self._paused = True
        self._post(lambda: self._single_steps.append(done))
        if self._stopped:   # no engine thread will run it: do not leave the caller waiting
            done.set()
        return done

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is unfinished and no command is pending."""
        with self._idle:
            return self._idle.wait_for(lambda: self._stopped or (
                not self._commands and not self.engine.has_unfinished()), timeout)

    def close(self, timeout: float = 10.0) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> "EngineLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- engine thread ------------------------------------------------------------------
    def _post(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake.set()

    @staticmethod
    def _stream_dropped(loop_ref, request_id: str, q=None) -> None:
        loop = loop_ref()
        if loop is not None and not loop._stopped:   # only if that stream's request is live
            loop._post(lambda: loop._sinks.get(request_id, (None,))[0] is q and loop._abort(
                request_id, "cancelled", "stream dropped by its consumer"))

    def _add(self, req: Request, q: queue.SimpleQueue) -> None:
        try:
            self.engine.add(req)
        except InvalidRequestError as exc:
            q.put(StreamEvent(req.request_id, (), (), "", True, "error", str(exc)))
            return
        self._sinks[req.request_id] = (q, [0, 0])

    def _abort(self, request_id: str, reason: str, error: str | None = None) -> None:
        req = self.engine.abort(request_id, reason, error)
        if req is not None:
            self._emit([req])

    def _run(self) -> None:
        try:
            while not self._stopped:
                self._drain_commands()
                self._sync_overlap()
                if self._should_step():
                    self._emit(self.engine.step())
                    if self._single_steps and self._paused:
                        self._single_steps.popleft().set()
                    self._publish(force=self._paused)
                else:
                    self._publish(force=True)
                    with self._idle:
                        self._idle.notify_all()
                    self._wake.wait(0.05)
                    self._wake.clear()
        except Exception as exc:   # a bug outside the forward: stop cleanly, tell everyone
            self._fail_all(f"engine stopped: {type(exc).__name__}: {exc}")
        finally:
            self._stopped = True
            self._close_streams()
            with self._idle:
                self._idle.notify_all()

    def _drain_commands(self) -> None:
        while self._commands:
            self._commands.popleft()()

    def _sync_overlap(self) -> None:
        """No overlapped step may stay in flight while paused: one step per key press."""
        self.engine.allow_chain = not self._paused
        if self._paused:
            self._emit(self.engine.flush())

    def _should_step(self) -> bool:
        if self._paused:
            if not self._single_steps:
                return False
            if not self.engine.has_unfinished():   # nothing to do: the step is a no-op
                self._single_steps.popleft().set()
                return False
            return True
        return self.engine.has_unfinished()

    def _publish(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self._last_publish >= self.snapshot_interval:
            self._snapshot = self.engine.snapshot(paused=self._paused)
            self._last_publish = now

    def _emit(self, touched: list[Request]) -> None:
        for req in touched:
            sink = self._sinks.get(req.request_id)
            if sink is None:
                continue
            q, sent = sink
            n_tok, n_text = sent
            done = req.status.done
            event = StreamEvent(req.request_id, tuple(req.output_token_ids[n_tok:]),
                                tuple(req.token_times[n_tok:]), req.text[n_text:], done,
                                req.finish_reason if done else None, req.error,
                                RequestOutput.from_request(req) if done else None)
            sent[0], sent[1] = len(req.output_token_ids), max(n_text, len(req.text))
            q.put(event)
            if done:
                del self._sinks[req.request_id]

    def _close_streams(self) -> None:
        """The loop ends (close or fatal error): no stream or step_once waits forever."""
        reason = "error" if self.fatal_error else "cancelled"
        message = self.fatal_error or "engine loop closed"
        while self._commands:          # requests submitted before the stop get their end
            try:
                self._commands.popleft()()
            except Exception:
                pass
        for rid in list(self.engine.requests):
            try:
                self._abort(rid, reason, message)
            except Exception:
                pass
        for rid, (q, _) in list(self._sinks.items()):
            q.put(StreamEvent(rid, (), (), "", True, reason, message))
        self._sinks.clear()
        while self._single_steps:
            self._single_steps.popleft().set()

    def _fail_all(self, message: str) -> None:
        self.fatal_error = message
        self.engine.stats.last_error = message
        for rid in list(self.engine.requests):
            try:
                self._emit([self.engine.abort(rid, "error", message)])
            except Exception:
                pass
        for rid, (q, _) in list(self._sinks.items()):
            q.put(StreamEvent(rid, (), (), "", True, "error", message))
        self._sinks.clear()
        try:
            self._snapshot = self.engine.snapshot(paused=self._paused)
        except Exception:
            pass

"""RequestStream: a client's handle on one request (iterate events, wait for the result,
cancel), and the choice of a request's sinks. Torch-free: clients of an engine in
another process import it without loading the model stack."""
from __future__ import annotations

import queue
import time
import weakref
from typing import Callable, Iterator

from engine.front.processor import StreamEvent
from engine.request_output import CompletionOutput, RequestMetrics, RequestOutput


class RequestStream:
    """Iterate for StreamEvents; `result()` waits for the final RequestOutput.

    If the consumer drops its stream before the request ends, the request is cancelled.
    Several threads may read one stream: the final event wakes all of them.
    """

    def __init__(self, request_id: str, cancel: Callable[[str], None],
                 dropped: Callable[[str], None] | None = None):
        """cancel: what `cancel()` calls; dropped: what a consumer dropping the stream
        before its end calls (its error says so), `cancel` if None."""
        self.request_id = request_id
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._final: StreamEvent | None = None
        self.output: RequestOutput | None = None
        self._cancel = cancel
        self._finalizer = weakref.finalize(self, dropped or cancel, request_id)

    @property
    def sink(self) -> Callable[[StreamEvent], None]:
        """Where the engine delivers this stream's events. It holds the queue, not the
        stream, so a consumer that drops the stream lets it be collected (and cancelled)."""
        return self._q.put

    def get(self, timeout: float | None = None) -> StreamEvent:
        if self._final is not None:
            return self._final
        event = self._q.get(timeout=timeout)
        if event.finished:   # refused/failed before it ran: a bare error output, never None
            self.output = event.output or RequestOutput(
                event.request_id, None, (), (CompletionOutput(0, "", (), event.finish_reason),),
                True, RequestMetrics.from_times(0.0, []), event.error)
            self._final = event
            self._finalizer.detach()
            self._q.put(event)          # wake any other reader blocked on the queue
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
        self._cancel(self.request_id)

    def detach(self) -> None:
        """Keep the request running even if this handle is dropped."""
        self._finalizer.detach()


def chain_sinks(stream: RequestStream, on_event, on_finish):
    """A request's sinks: by default every event queues for the stream; with `on_finish`
    alone the stream gets only the final event (no per-token event is built); with
    `on_event` the callback gets every event and the stream none."""
    if on_event is None and on_finish is None:
        return stream.sink, None
    if on_event is None:
        sink, callback = stream.sink, on_finish

        def both(event):
            sink(event)
            callback(event)
        return None, both
    return on_event, on_finish

"""Engine events -> asyncio: one Generation per HTTP request (its n choices).

`EngineLoop.submit(..., on_event=cb)` calls cb on the engine thread (the client's IO
thread) for every step delta; cb only drops the event in the event loop's Mailbox, so
the engine never waits for the server. One step delivers an event per running request
(256 under W1): the mailbox wakes the event loop once per batch, not once per event
(each wake is a write to the loop's self-pipe and a callback), and a Generation hands
its reader every event that is queued at once (roseplay/serve/streaming.py coalesces
them into one SSE write per choice). A Generation keeps its RequestStream objects
(dropping one cancels its request) and cancels every unfinished choice when it is
closed early: a client that disconnects (the handler task is cancelled) frees its KV
blocks at the engine's next step.

A request the server did not cancel itself never ends as a silent cancel: an engine
that ends it "cancelled" (it stopped under another client, say) cut it, and the choice
ends with an error (an SSE error event, a 5xx), as every cut does.

Admission control: `pending` counts this server's requests that have no token yet
(queued in the engine or prefilling). With `max_waiting` set, a request whose choices
would take `pending` over it is refused with 429 (nothing is submitted); without it,
requests queue in the engine without bound, as in vLLM.

Slow readers: the engine never waits for a client, so a stream whose client reads
slower than its tokens come keeps them queued here. `max_backlog` bounds that queue (its
tokens, each top logprob one more): past it the stream's queue is dropped, its requests
are cancelled and it ends with an error event, as a cut stream does.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from engine.codes import REASON_CANCELLED, REASON_ERROR
from roseplay.serve.errors import OpenAIError
from roseplay.serve.metrics import ServerMetrics

# what one stream may hold unread (a client that reads slower than its tokens come): its
# tokens, each logprob returned counting as one more; 100-330 bytes each (measured), so
# at most ~45 MB a stream (docs/SERVE.md "Limits and timeouts")
DEFAULT_MAX_STREAM_BACKLOG = 1 << 17


@dataclass
class Choice:
    index: int
    request_id: str
    prompt_len: int
    arrival: float
    stream: object = None
    last_time: float | None = None
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    output: object = None
    counts_prompt: bool = True      # the first choice of its prompt (n > 1: one counts it)
    engine: int = 0                 # the replica serving it (data parallelism; metrics)
    group: "PromptGroup | None" = None


@dataclass
class PromptGroup:
    """The n choices of one prompt: vLLM's request-level metrics (request_params_n,
    request_params_max_tokens, request_max_num_generation_tokens) observe the prompt
    once, when its last choice finishes."""
    max_tokens: int
    n: int = 0
    left: int = 0
    max_generated: int = 0


class Mailbox:
    """Events from the engine's thread to one asyncio loop, one wake-up per batch."""

    def __init__(self, aloop: asyncio.AbstractEventLoop):
        self._aloop, self._lock = aloop, threading.Lock()
        self._inbox: list = []
        self._scheduled = False

    def post(self, gen: "Generation", event) -> None:      # any thread
        with self._lock:
            self._inbox.append((gen, event))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._aloop.call_soon_threadsafe(self._deliver)
        except RuntimeError:          # the event loop is closed: nobody reads these
            pass

    def _deliver(self) -> None:       # the event loop
        with self._lock:
            batch, self._inbox, self._scheduled = self._inbox, [], False
        for gen, event in batch:
            gen._receive(event)


class EngineBridge:
    def __init__(self, loop, metrics: ServerMetrics, max_waiting: int | None = None,
                 max_backlog: int = DEFAULT_MAX_STREAM_BACKLOG):
        self.loop, self.metrics, self.max_waiting = loop, metrics, max_waiting
        self.max_backlog = max_backlog
        self.pending = 0
        self._mailboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def mailbox(self, aloop: asyncio.AbstractEventLoop) -> Mailbox:
        box = self._mailboxes.get(aloop)
        if box is None:
            box = self._mailboxes[aloop] = Mailbox(aloop)
        return box

    def start(self, engine_id: str, prompts: list[dict],
              params: list, priority: int = 0,
              data_parallel_rank: int | None = None) -> "Generation":
        """Submit one engine request per (prompt, params) pair: ids f"{engine_id}-{i}"
        (request_ids.assign: unique in this server, whatever the client sent);
        data_parallel_rank pins them to a replica (a data-parallel front; one engine
        takes only 0)."""
        pin = _pin(self.loop, data_parallel_rank)
        if self.max_waiting is not None and self.pending + len(prompts) > self.max_waiting:
            raise OpenAIError(429, f"server busy: {self.pending} requests are waiting for "
                                   f"their first token (--max-waiting {self.max_waiting}); "
                                   "retry later", code="queue_full")
        gen = Generation(self, self.mailbox(asyncio.get_running_loop()))
        groups: dict[int, PromptGroup] = {}     # the n choices of a prompt share its dict
        try:
            for i, (prompt, sp) in enumerate(zip(prompts, params)):
                gen.submit(i, f"{engine_id}-{i}", prompt, sp, priority, pin)
                choice, group = gen.choices[-1], groups.get(id(prompt))
                choice.counts_prompt = group is None
                if group is None:      # (max_tokens: resolved for the prompt, prompts.py)
                    group = groups[id(prompt)] = PromptGroup(sp.max_tokens)
                group.n += 1
                group.left += 1
                choice.group = group
        except BaseException:
            gen.close()
            raise
        return gen


class Generation:
    """The choices of one HTTP request; iterate `batches()` for what is queued at once,
    or `events()` for (choice, StreamEvent) one by one."""

    def __init__(self, bridge: EngineBridge, mailbox: Mailbox):
        self.bridge, self.choices = bridge, []
        self._by_id: dict[str, Choice] = {}
        self._queue: deque = deque()
        self._wake: asyncio.Future | None = None
        self._mailbox = mailbox
        self._unread = 0        # tokens in _queue
        self._weight = 1        # backlog units per token: 1, +1 per logprob returned
        self._overrun = False   # the backlog passed max_backlog: the queue was dropped
        self.writing = False    # its SSE response is being sent (routes.SSEResponse)

    def _on_event(self, event) -> None:        # engine thread: hand over, nothing more
        self._mailbox.post(self, event)

    def _receive(self, event) -> None:         # the event loop (Mailbox._deliver)
        if self._overrun and not isinstance(event, EndEvent):
            return
        self._queue.append(event)
        self._unread += len(event.token_ids)
        if self._unread * self._weight > self.bridge.max_backlog:
            self._drop_backlog()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def submit(self, index: int, request_id: str, prompt: dict, params, priority: int = 0,
               pin: dict | None = None) -> None:
        choice = Choice(index, request_id, len(prompt["prompt_token_ids"]), time.perf_counter())
        loop = self.bridge.loop
        try:
            choice.stream = loop.submit(prompt, params, request_id=request_id,
                                        on_event=self._on_event, priority=priority,
                                        **(pin or {}))
        except RuntimeError as exc:        # the engine loop stopped
            raise OpenAIError(503, str(exc), code="engine_unavailable") from None
        replica_of = getattr(loop, "replica_of", None)
        if replica_of is not None:
            choice.engine = replica_of(request_id) or 0
        self.choices.append(choice)
        self._by_id[request_id] = choice
        self.bridge.pending += 1
        if params.logprobs is not None:    # the sampled token's logprob and the top ones
            self._weight = max(self._weight, 2 + params.logprobs)

    def _drop_backlog(self) -> None:
        """The client left more than max_backlog unread: free what it did not read and
        end its unfinished choices with an error (their engine requests cancelled)."""
        self._queue.clear()
        self._unread, self._overrun = 0, True
        self.end_with_error(f"the client read too slowly: more than "
                            f"{self.bridge.max_backlog} tokens unread (--max-stream-backlog); "
                            "the request was cancelled", status=500)

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.choices)

    async def batches(self):
        """Yield lists of (choice, event), everything queued at each wake-up, until
        every choice has finished."""
        while not self.done:
            if not self._queue:
                self._wake = asyncio.get_running_loop().create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
            batch = []
            while self._queue and not self.done:
                event = self._queue.popleft()
                self._unread -= len(event.token_ids)
                choice = self._by_id.get(event.request_id)
                if choice is None or choice.finished:
                    continue
                event = _cut_not_cancelled(event)
                self._account(choice, event)
                batch.append((choice, event))
            if batch:
                yield batch

    async def events(self):
        """Yield (choice, event) until every choice has finished."""
        async for batch in self.batches():
            for item in batch:
                yield item

    async def results(self) -> list[Choice]:
        async for _ in self.events():
            pass
        return self.choices

    def _account(self, c: Choice, event) -> None:
        m = self.bridge.metrics
        if event.token_ids and c.last_time is None:
            self.bridge.pending -= 1
        m.observe_tokens(c.arrival, c.last_time, event.token_times, c.engine)
        if event.token_times:
            c.last_time = event.token_times[-1]
        c.token_ids.extend(event.token_ids)
        if event.finished:
            self._finish(c, event.finish_reason, event.error, event.output)

    def _finish(self, c: Choice, reason: str | None, error: str | None, output) -> None:
        if c.last_time is None:
            self.bridge.pending -= 1
        c.finished, c.finish_reason, c.error, c.output = True, reason, error, output
        if c.stream is not None:
            # the engine ended it, or close() cancelled it: dropping the handle must not
            # send the engine one more Abort (a message per request under load)
            c.stream.detach()
            c.stream = None
        m = self.bridge.metrics
        m.observe_finish(output, reason, time.perf_counter(), c.arrival, c.counts_prompt,
                         c.engine)
        if (g := c.group) is not None:
            g.left -= 1
            g.max_generated = max(g.max_generated, len(c.token_ids))
            if g.left == 0:
                m.observe_request(g.n, g.max_tokens, g.max_generated, c.engine)

    def close(self) -> None:
        """Cancel what is still running (client gone, or an error): blocks go back to the
        pool at the engine's next step."""
        for c in self.choices:
            if not c.finished:
                self.bridge.loop.cancel(c.request_id)
                self._finish(c, "cancelled", None, None)

    def abort(self) -> None:
        """close(), and wake the reader of batches() so that it ends now (the client left)."""
        self.close()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def end_with_error(self, message: str, status: int = 503) -> int:
        """End every unfinished choice with an error event (after the events already
        queued) and cancel its engine request; returns how many."""
        ended = [c for c in self.choices if not c.finished]
        self.error_status = status       # a non-streamed request's (else 500)
        for c in ended:
            self.bridge.loop.cancel(c.request_id)
            self._on_event(EndEvent(c.request_id, message, status))   # the engine's path
        return len(ended)


def _pin(loop, rank: int | None) -> dict | None:
    """The submit argument that pins a replica (None: the router chooses)."""
    if rank is None:
        return None
    if hasattr(loop, "router"):
        return {"data_parallel_rank": rank}      # the front checks the range
    if rank != 0:
        raise OpenAIError(400, f"data_parallel_rank must be 0: this server has one engine "
                               f"(got {rank})", param="data_parallel_rank")
    return None


def _cut_not_cancelled(event):
    """Our own cancels finish a choice before any engine event of it is read (close()),
    so a "cancelled" from the engine is a cut: an error naming it."""
    if event.finished and event.finish_reason == REASON_CANCELLED:
        return dataclasses.replace(event, finish_reason=REASON_ERROR, error=(
            f"the engine ended this request ({event.error or 'cancelled'})"))
    return event


@dataclass(frozen=True)
class EndEvent:
    """A finish the server gives a choice itself (shutdown): shaped as a StreamEvent
    (its status is the HTTP status of a non-streamed request's error)."""
    request_id: str
    error: str
    status: int = 503
    text: str = ""
    token_ids: tuple = ()
    token_times: tuple = ()
    finished: bool = True
    finish_reason: str = "error"
    output: object = None

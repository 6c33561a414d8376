"""WorkloadDriver: feeds scenario work items to an EngineLoop on one background thread.

Arrival process (`next_gap`): a burst at t=0 (no rate, no interval), a fixed
`submit_interval` (s), or arrivals at `request_rate` (req/s): Poisson, or gamma-distributed
gaps of shape `burstiness` (vLLM's --burstiness; 1 is Poisson); an optional
`concurrency` cap holds arrivals until a slot frees (like vLLM's --max-concurrency).
One thread submits and consumes every stream by non-blocking polls (no thread per
request); it never blocks the engine. TTFT is measured from submission (the engine
stamps arrival_time in `submit`). Live controls: set_scenario, set_concurrency,
set_rate, pause/resume, stop. `num_requests=None` runs forever (the TUI).
"""
from __future__ import annotations

import itertools
import queue
import random
import secrets
import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator

import msgspec

from engine.request_output import RequestOutput
from roseplay.workload.items import WorkItem
from roseplay.workload.scenarios import iter_workload

# Longest sleeps (a finishing request or stop() wakes the driver at once)
POLL_INTERVAL = 0.02    # while a submission waits for a concurrency slot
SLOW_POLL_INTERVAL = 0.05  # while requests are in flight but nothing waits on them
IDLE_INTERVAL = 0.02    # while nothing is in flight or due (pause/resume/rate changes)
REFUSED_BACKOFF = 0.5   # an endless driver's pause after the engine refused a request (a
#                         workload the pool cannot hold would otherwise resubmit at once,
#                         forever, spinning a core)
KEPT_ERRORS = 100       # submit_errors keeps the first ones (a report prints a few)
_DRIVER_IDS = itertools.count()
# Three letters of a random tag per process (no i, l, o: read apart from 1 and 0): two
# processes attached to one engine (two `roseplay --connect`, a TUI and a bench) draw
# different ids, which the engine needs (it refuses an id live for another client)
PROCESS_TAG = "".join(secrets.choice("abcdefghjkmnpqrstuvwxyz") for _ in range(3))
TOP_LOGPROBS = 5    # what a request asks for when the TUI should show its distribution


def next_gap(rng: random.Random, request_rate: float | None,
             submit_interval: float | None, burstiness: float = 1.0) -> float:
    """Seconds until the next arrival: 0 (burst), fixed interval, or a gamma draw of
    shape `burstiness` and mean 1 / request_rate, as vLLM's bench draws them: 1 is
    exponential (Poisson arrivals), below 1 burstier, above 1 more even."""
    if submit_interval is not None:
        return submit_interval
    if request_rate is None or request_rate == float("inf"):
        return 0.0
    if burstiness == 1.0:     # the same draws as before the shape was a setting
        return rng.expovariate(request_rate)
    return rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))


def arrival_offsets(n: int, *, request_rate: float | None = None,
                    submit_interval: float | None = None, burstiness: float = 1.0,
                    seed: int = 0) -> list[float]:
    """Arrival offsets (s) of n requests from t=0; the first arrives at 0."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        if i:
            t += next_gap(rng, request_rate, submit_interval, burstiness)
        out.append(t)
    return out


class WorkloadDriver:
    """Submit work items to `loop` and collect the finished RequestOutputs.

    `scenario` is a scenario name (items from `iter_workload(name, **workload)`) or any
    iterable of WorkItems (e.g. a `build_workload` list). Items with an `arrival`
    offset are submitted at that offset; others follow the arrival process. Request ids
    are f"{id_prefix}{n}" for the n-th submission (`submission_index` inverts it); the
    default prefix, `w<k><PROCESS_TAG>-` for this process's k-th driver (`w0kqf-12`), is
    unique across the processes attached to one engine, and its counter stays last: a
    narrow column keeps an id's end (roseplay/tui/widgets/requests.py `short_id`).
    `epoch` (a perf_counter time) is when arrival offsets count from: drivers that share
    one workload stream (roseplay/workload/shared.py) share it.
    """

    def __init__(self, loop, scenario: str | Iterable[WorkItem] = "shared-prefix", *,
                 concurrency: int | None = None, request_rate: float | None = None,
                 submit_interval: float | None = None, burstiness: float = 1.0,
                 num_requests: int | None = None, workload: dict | None = None,
                 seed: int = 0, keep_outputs: int | None = None,
                 on_output: Callable[[RequestOutput], None] | None = None,
                 cancel_on_stop: bool = True, id_prefix: str | None = None,
                 epoch: float | None = None, logprobs_every: int = 0):
        self.loop = loop
        self.logprobs_every = logprobs_every   # every Nth request asks for TOP_LOGPROBS (0: none)
        self._epoch = epoch          # perf_counter time item arrivals count from (shared)
        self.id_prefix = id_prefix if id_prefix is not None else f"w{next(_DRIVER_IDS)}{PROCESS_TAG}-"
        self.workload = dict(workload or {})
        self.num_requests = num_requests
        self.on_output = on_output
        self.cancel_on_stop = cancel_on_stop
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._items: Iterator[WorkItem] | None = iter(())
        self._held: WorkItem | None = None        # an item waiting for its arrival offset
        self.scenario_name = ""
        self.set_scenario(scenario)
        self.concurrency = concurrency
        self.request_rate, self.submit_interval = request_rate, submit_interval
        self.burstiness = burstiness      # the gaps' gamma shape under request_rate
        maxlen = keep_outputs if keep_outputs is not None else (None if num_requests else 1024)
        self.outputs: deque[RequestOutput] = deque(maxlen=maxlen)
        self.in_flight: dict[str, tuple] = {}      # request id -> (stream, item)
        self.submitted = self.completed = self.failed = self.max_in_flight = 0
        self.submit_errors: list[str] = []      # the first KEPT_ERRORS
        self.last_error: str | None = None      # the latest refusal (since the scenario)
        self.refused = 0
        self.start_time: float | None = None
        self._next_due = 0.0
        self._paused = False
        self._stop = threading.Event()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()   # final events (engine thread)
        self._thread = threading.Thread(target=self._run, name="roseplay-driver", daemon=True)

    # -- control (any thread) ----------------------------------------------------------
    def start(self) -> "WorkloadDriver":
        self._thread.start()
        return self

    def set_scenario(self, scenario: str | Iterable[WorkItem], **workload) -> None:
        """Switch the item source (name or iterable); later submissions use it."""
        self.workload.update(workload)
        if isinstance(scenario, str):
            items, name = iter_workload(scenario, **self.workload), scenario
        else:
            items, name = iter(scenario), "custom"
        with self._lock:
            self._items, self._held, self.scenario_name = items, None, name
        self.refused, self.last_error = 0, None     # refusals of the new items count anew

    def set_concurrency(self, concurrency: int | None) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be >= 1 or None")
        self.concurrency = concurrency

    def set_rate(self, request_rate: float | None = None,
                 submit_interval: float | None = None) -> None:
        """Poisson `request_rate` (req/s), fixed `submit_interval` (s), or neither (burst)."""
        if request_rate is not None and submit_interval is not None:
            raise ValueError("give request_rate or submit_interval, not both")
        if (request_rate is not None and request_rate <= 0) or (
                submit_interval is not None and submit_interval < 0):
            raise ValueError("request_rate must be > 0 and submit_interval >= 0")
        self.request_rate, self.submit_interval = request_rate, submit_interval
        self._next_due = time.perf_counter()

    def pause(self) -> None:
        """Stop submitting (in-flight requests go on)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._next_due = time.perf_counter()

    @property
    def paused(self) -> bool:
        return self._paused

    def cancel_in_flight(self) -> None:
        """Cancel every request this driver has in flight (on its thread, soon): a new
        setup (a guide) starts from an empty queue, not behind the old one's backlog."""
        self._cancel.set()
        self._finished.put(None)       # wake a sleeping driver

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop submitting; cancel in-flight requests if `cancel_on_stop`; join."""
        self._stop.set()
        self._finished.put(None)       # wake a sleeping driver
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until num_requests have finished (or the driver stopped)."""
        return self._done.wait(timeout)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def submission_index(self, request_id: str) -> int:
        """n for the n-th request this driver submitted (0-based)."""
        return int(request_id.removeprefix(self.id_prefix))

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    # -- driver thread -------------------------------------------------------------------
    def _run(self) -> None:
        self.start_time = self._next_due = (self._epoch if self._epoch is not None
                                            else time.perf_counter())
        try:
            while not self._stop.is_set() and not self._all_done():
                if self._cancel.is_set():
                    self._cancel.clear()
                    for stream, _ in list(self.in_flight.values()):
                        stream.cancel()
                submitted = self._submit_due()
                polled = self._poll()
                if not submitted and not polled:
                    self._sleep()
            if self._stop.is_set() and self.cancel_on_stop:
                for stream, _ in list(self.in_flight.values()):
                    stream.cancel()
        finally:
            self._done.set()

    def _all_done(self) -> bool:
        exhausted = self.num_requests is not None and self.submitted >= self.num_requests
        return (exhausted or (self._items is None and self._held is None)) and not self.in_flight

    def _can_submit(self) -> bool:
        if not self._more_to_submit():
            return False
        return self.concurrency is None or len(self.in_flight) < self.concurrency

    def _submit_due(self) -> int:
        count = 0
        while self._can_submit():
            now = time.perf_counter()
            if now < self._next_due:
                break
            item = self._next_item()
            if item is None:
                break
            if item.arrival is not None and now < self.start_time + item.arrival:
                self._held, self._next_due = item, self.start_time + item.arrival
                break
            if not self._submit(item):
                if self.num_requests is None:       # endless: wait, do not spin
                    self._next_due = now + REFUSED_BACKOFF
                break
            count += 1
            if item.arrival is None:
                self._advance_due(now)
        return count

    def _next_item(self) -> WorkItem | None:
        with self._lock:
            item, self._held = self._held, None
            if item is None:
                item = next(self._items, None)
                if item is None:
                    self._items = None
            return item

    def _advance_due(self, now: float) -> None:
        """Schedule the next arrival; an endless driver catches up at most 1 s of backlog."""
        gap = next_gap(self._rng, self.request_rate, self.submit_interval, self.burstiness)
        if not gap:
            self._next_due = now
        elif self.num_requests is None:
            self._next_due = max(self._next_due + gap, now - 1.0)
        else:
            self._next_due += gap

    def _error(self, text: str) -> None:
        self.failed += 1
        self.refused += 1
        self.last_error = text
        if len(self.submit_errors) < KEPT_ERRORS:
            self.submit_errors.append(text)

    def _submit(self, item: WorkItem) -> bool:
        """Submit `item`; False if the engine refused it (counted in `failed`)."""
        rid = f"{self.id_prefix}{self.submitted}"
        params = item.params
        if self.logprobs_every and self.submitted % self.logprobs_every == 0 \
                and params.logprobs is None:
            params = msgspec.structs.replace(params, logprobs=TOP_LOGPROBS)
        self.submitted += 1
        try:
            stream = self.loop.submit(item.prompt, params, request_id=rid,
                                      on_finish=self._finished.put, priority=item.priority)
        except Exception as exc:        # invalid request or stopped loop: count, go on
            self._error(f"{type(exc).__name__}: {exc}")
            return False
        self.in_flight[stream.request_id] = (stream, item)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        return True

    def _poll(self, timeout: float = 0.0) -> int:
        """Collect finished requests (waiting up to `timeout` for the first); returns how
        many. The engine pushes final events into one queue: no per-stream polling, and
        the driver sleeps in a GIL-free wait instead of competing with the engine."""
        done = 0
        while True:
            try:
                event = self._finished.get(timeout=timeout) if timeout > 0 else self._finished.get_nowait()
            except queue.Empty:
                return done
            timeout = 0.0
            if event is None:          # stop() wake-up
                continue
            entry = self.in_flight.pop(event.request_id, None)
            if entry is None:
                continue
            done += 1
            self._collect(event.output, event.error)

    def _collect(self, output: RequestOutput | None, error: str | None = None) -> None:
        if output is None or output.error is not None or error is not None:
            if output is None:
                self._error(error or "request failed")
            else:
                self.failed += 1
        else:
            self.completed += 1
        if output is not None:
            self.outputs.append(output)
            if self.on_output is not None:
                self.on_output(output)

    def _more_to_submit(self) -> bool:
        if self._paused or (self._items is None and self._held is None):
            return False
        return self.num_requests is None or self.submitted < self.num_requests

    def _sleep(self) -> None:
        """Sleep until the next arrival or poll; poll fast only when a slot is awaited
        (timings come from the engine, so a slower poll only delays bookkeeping)."""
        if not self.in_flight:
            wait = IDLE_INTERVAL
        elif self.concurrency is not None and self._more_to_submit():
            wait = POLL_INTERVAL
        else:
            wait = SLOW_POLL_INTERVAL
        if self._can_submit():
            wait = min(wait, max(0.0, self._next_due - time.perf_counter()))
        if wait > 0:
            self._poll(timeout=wait)


"""CoreLoop: the engine core's busy loop (commands, pause / single step, step, publish).

It owns an LLMEngine and runs on one thread: in-process (engine/ipc/inproc.py), or as
the main loop of the engine-core process (engine/ipc/core_proc.py). Transports post
requests and commands (engine/commands.py; any thread); the loop applies them in
`handle` before its next step, so a knob change takes effect at the next step and
nothing touches engine state concurrently. After each step it hands the StepOutput to
`on_output` and, at most every `snapshot_interval` seconds (every step and command
while paused, and the unchanged state again every PAUSED_REPUBLISH), publishes a fresh
immutable snapshot by swapping a reference: readers never lock.
While paused the serving clock stops (engine/core/clock.py) and runs only during single steps.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from engine.codes import ENGINE_CLOSED, REASON_CANCELLED, REASON_ERROR
from engine.commands import (Abort, Barrier, Command, ResetPeakUsage, ResetPrefixCache,
                             SetKnobs, SetPaused, StepOnce)
from engine.config import InvalidRequestError, changed_knobs
from engine.core.core import LLMEngine
from engine.outputs import CoreRequest, FinishedRequest, StepOutput
from engine.snapshot import EngineSnapshot
from engine.core.stats import engine_stats
from engine.engine_stats import EngineStats


SNAPSHOT_BUDGET = 0.03    # the most of the engine thread's time that snapshots may take
STATS_INTERVAL = 0.05     # EngineStats at most 20 Hz while busy (a Prometheus scrape is
STATS_IDLE_INTERVAL = 1.0  # seconds apart); idle: once on going idle, then this often
# Paused, the state changes only by a command or a single step, and each publishes at
# once; between them the same state is published again this often (a subscriber that
# joined late, or a dropped frame, still gets it), not at the UI's rate
PAUSED_REPUBLISH = 1.0
# however costly a snapshot, a watcher sees the engine at least this often
SNAPSHOT_MAX_INTERVAL = 1.0
Reply = Callable[[object], None]   # StepOnce: reply(None) after the step; Barrier: reply(snapshot)


class CoreLoop:
    def __init__(self, engine: LLMEngine, on_output: Callable[[StepOutput], None],
                 snapshot_interval: float = 0.02,
                 on_snapshot: Callable[[EngineSnapshot], None] | None = None):
        self.engine = engine
        self.on_output = on_output
        self.on_snapshot = on_snapshot
        self.snapshot_interval = float(snapshot_interval)
        self.publish_cost = 0.0        # seconds the last snapshot cost outside this thread
        #                                (the engine process's encoding: it holds the GIL)
        self._commands: deque[tuple[CoreRequest | Command, Reply | None]] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None   # the loop's, once it runs
        self._idle = threading.Condition()
        self._paused = False
        self._single_steps: deque[Callable[[], None]] = deque()
        self.stopped = False
        self._idle_published = False   # idle, with a snapshot taken after the last step
        self.fatal_error: str | None = None
        self._snapshot = engine.snapshot()
        self._next_publish = 0.0
        self._barriers: list[Reply] = []
        self.publish_snapshots = True   # periodic snapshots (the engine process turns them
        #                                 off while no client subscribes)
        self.on_idle: Callable[[], None] | None = None   # run when the engine goes idle
        self._busy = False
        self.on_stats: Callable[[EngineStats], None] | None = None   # each EngineStats
        self.stats = engine_stats(engine, time.perf_counter())   # the latest (any thread)
        self._last_stats = 0.0

    # -- requests and commands (any thread) -----------------------------------------
    def post(self, msg: CoreRequest | Command, reply: Reply | None = None) -> None:
        """Queue a request or a command for `handle` before the next step. `reply` (for
        StepOnce and Barrier) is called on the loop's thread with the answer."""
        self._idle_published = False
        self._commands.append((msg, reply))
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._paused

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending and the published snapshot is current."""
        with self._idle:
            return self._idle.wait_for(lambda: self.stopped or (
                self._idle_published and not self._commands), timeout)

    def stop(self) -> None:
        """Stop (any thread). On the loop's own thread it only sets the flag: there it
        runs in a signal handler (the engine process's SIGTERM) that may have interrupted
        the loop inside `_wake.wait`, holding the wake's lock, which `_wake.set()` would
        wait for forever; the loop sees the flag within its idle wait (0.05 s)."""
        self.stopped = True
        if threading.current_thread() is not self._thread:
            self._wake.set()

    # -- the loop (its own thread) ---------------------------------------------------
    def run(self) -> None:
        self._thread = threading.current_thread()
        try:
            while not self.stopped:
                commanded = self._drain_commands()
                self._sync_pause()
                if self._should_step():
                    self._idle_published = False
                    self._busy = True
                    self._step()
                    self._publish_stats(STATS_INTERVAL)
                else:
                    # fresh after a step or a command (a cache clear while idle moves
                    # kv_events_seq; a barrier's caller then reads current stats)
                    self._publish_stats(0.0 if self._busy or commanded
                                        else STATS_IDLE_INTERVAL)
                    if self._busy and self.on_idle is not None:
                        self.on_idle()     # work nobody waits for: between bursts
                    # the state after the last step and command (barriers, wait_idle and
                    # watchers read it); else only the periodic one, for watchers
                    self._publish(force=self._busy or commanded)
                    self._busy = False
                    with self._idle:
                        self._idle_published = not self._commands
                        self._idle.notify_all()
                    self._release_barriers()
                    self._wake.wait(0.05)
                    self._wake.clear()
        except Exception as exc:   # a bug outside the forward: stop, tell everyone
            self.fatal_error = f"engine stopped: {type(exc).__name__}: {exc}"
            self.engine.stats.last_error = self.fatal_error
        finally:
            self.stopped = True
            self._shutdown()
            self.engine.close()
            with self._idle:
                self._idle.notify_all()

    def _step(self) -> None:
        single = self._paused and self._single_steps
        clock = self.engine.clock
        if single:
            clock.resume()     # the serving clock runs only while a single step runs
        self._emit(self.engine.step())
        if single:
            clock.pause()
            self._single_steps.popleft()()
        else:      # asked for before another client resumed: this step answers them
            self._answer_single_steps()
        self._publish(force=self._paused)

    def _answer_single_steps(self) -> None:
        while self._single_steps:
            self._single_steps.popleft()()

    def _release_barriers(self) -> None:
        if self._barriers and not self._commands:
            barriers, self._barriers = self._barriers, []
            for callback in barriers:
                callback(self._snapshot)

    def _drain_commands(self) -> bool:
        """Handle what was posted; True if there was any."""
        commanded = bool(self._commands)
        while self._commands:
            self.handle(*self._commands.popleft())
        return commanded

    def handle(self, msg: CoreRequest | Command, reply: Reply | None = None) -> None:
        """Apply one request or command (the loop's thread, between steps): the one
        place every transport's controls take effect."""
        e = self.engine
        match msg:
            case CoreRequest():
                self._add(msg)
            case Abort(request_id=rid, reason=reason, error=error):
                self._emit(e.abort_output(rid, reason, error))
            case SetKnobs(knobs=changes):
                self._set_knobs(changed_knobs(changes))
            case SetPaused(paused=paused):
                self._paused = paused
            case StepOnce():
                self._paused = True
                self._single_steps.append(lambda: reply(None) if reply else None)
            case ResetPrefixCache():
                e.clear_prefix_cache()
            case ResetPeakUsage():
                e.stats.peak_used_blocks = e.pool.num_used
            case Barrier() if reply is not None:
                self._barriers.append(reply)

    def _set_knobs(self, changes: dict) -> None:
        """The one check of live knobs on the core's side of the seam (bounds and choices:
        SchedulerConfig); one from a client that skipped its own changes nothing. Only
        the changed fields apply: several clients may change different knobs."""
        try:
            knobs = self.engine.knobs.replace(**changes)
        except (InvalidRequestError, TypeError):
            return
        self.engine.set_knobs(knobs)

    def _sync_pause(self) -> None:
        """Paused: no step stays in flight (one step per key press) and the clock stops."""
        eng = self.engine
        eng.async_scheduling = eng.async_scheduling_enabled and not self._paused
        if self._paused:
            self._emit(eng.flush())
            eng.clock.pause()
        else:
            eng.clock.resume()

    def _should_step(self) -> bool:
        if self._paused:
            if not self._single_steps:
                return False
            if not self.engine.has_unfinished():   # nothing to do: the step is a no-op
                self._single_steps.popleft()()
                return False
            return True
        if not self.engine.has_unfinished():      # (resumed: no step to answer them)
            self._answer_single_steps()
            return False
        return True

    def _add(self, creq: CoreRequest) -> None:
        try:
            self.engine.add(creq)
        except InvalidRequestError as exc:
            self._emit(StepOutput(finished=[FinishedRequest(creq.request_id, REASON_ERROR,
                                                            str(exc), 0.0, 0, 0)]))

    def _emit(self, out: StepOutput) -> None:
        if out:
            self.on_output(out)

    def _publish_stats(self, interval: float) -> None:
        """A fresh EngineStats if `interval` passed since the last one (0: now)."""
        now = time.perf_counter()
        if now - self._last_stats >= interval:
            self._last_stats = now
            self.stats = engine_stats(self.engine, now)
            if self.on_stats is not None:
                self.on_stats(self.stats)

    def _publish(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or (self.publish_snapshots and now >= self._next_publish):
            cpu = time.thread_time()
            self._snapshot = self.engine.snapshot(paused=self._paused)
            self.engine.counters.snapshot_build_us += int((time.perf_counter() - now) * 1e6)
            # watching may cost the engine at most SNAPSHOT_BUDGET of its time: a costly
            # snapshot (a full pool, hundreds of requests) comes less often, a cheap one
            # at the UI's rate; paused or single-stepping, every step still publishes.
            # The cost is CPU time: a build stretched by a wait for the GIL or a loaded
            # CPU costs the engine nothing, and 1 s of such waiting once put the next
            # snapshot 33 s away
            cost = time.thread_time() - cpu + self.publish_cost
            interval = PAUSED_REPUBLISH if self._paused else self.snapshot_interval
            self._next_publish = now + min(SNAPSHOT_MAX_INTERVAL,
                                           max(interval, cost / SNAPSHOT_BUDGET))
            if self.on_snapshot is not None:
                self.on_snapshot(self._snapshot)

    def _shutdown(self) -> None:
        """The loop ends (stop or fatal error): every request gets its end."""
        reason = REASON_ERROR if self.fatal_error else REASON_CANCELLED
        message = self.fatal_error or ENGINE_CLOSED
        out = StepOutput()
        while self._commands:          # requests submitted before the stop get their end
            try:
                self.handle(*self._commands.popleft())
            except Exception:
                pass
        for rid in list(self.engine.requests):
            try:
                self.engine.abort(rid, reason, message, out)
            except Exception:
                pass
        try:
            self._emit(out)
        except Exception:
            pass
        self._answer_single_steps()
        try:
            self._snapshot = self.engine.snapshot(paused=self._paused)
        except Exception:
            pass
        barriers, self._barriers = self._barriers, []
        for callback in barriers:
            callback(self._snapshot)

"""InprocTransport: the CoreTransport (engine/ipc/transport.py) to a CoreLoop on a thread
of this process.

Requests and commands are handed to the loop as they are (CoreLoop.post; applied in
CoreLoop.handle before its next step), and each StepOutput goes to the front on the
loop's thread. The front reaches the core only through ipc/
(tests/engine/test_import_rules.py), as it reaches an engine process over ZMQ.
"""
from __future__ import annotations

import threading

from engine.commands import StepOnce
from engine.config import EngineConfig, make_config
from engine.core.core import LLMEngine
from engine.core.core_loop import CoreLoop
from engine.engine_stats import EngineStats
from engine.outputs import EngineInfo
from engine.snapshot import EngineSnapshot

__all__ = ["InprocTransport", "LLMEngine"]


class InprocTransport:
    address = proc = None      # no engine process
    def __init__(self, engine: LLMEngine | None = None, *, config: EngineConfig | None = None,
                 snapshot_interval: float = 0.02, **kwargs):
        if engine is None:
            config = config or make_config(**kwargs)
            config.check_in_process()
            engine = LLMEngine(config)
        self.engine = engine
        self.info = EngineInfo.of(engine)
        self.tokenizer = engine.tokenizer
        self.knobs, self.paused = engine.knobs, False
        self.core = CoreLoop(engine, self._output, snapshot_interval)
        self.thread = threading.Thread(target=self._run, name="roseplay-engine", daemon=True)
        self._front = None

    def start(self, front) -> None:
        self._front = front
        self.thread.start()

    @property
    def fatal_error(self) -> str | None:
        return self.core.fatal_error

    @property
    def stopped(self) -> bool:
        return self.core.stopped

    @property
    def unavailable(self) -> str | None:
        return (self.fatal_error or "engine closed") if self.stopped else None

    def pack(self, msg):
        return msg

    def send_packed(self, msg) -> None:
        self.core.post(msg)

    send = send_packed

    def step_once(self) -> threading.Event:
        done = threading.Event()
        self.core.post(StepOnce(), lambda _: done.set())
        if self.core.stopped:      # no loop will run it: do not leave the caller waiting
            done.set()
        return done

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.core.wait_idle(timeout) and self.fatal_error is None

    def watch(self, on: bool) -> None:
        """While dropped the loop builds a snapshot only when it goes idle, pauses or
        single-steps."""
        self.core.publish_snapshots = bool(on)

    def snapshot(self) -> EngineSnapshot:
        return self.core.snapshot()

    def engine_stats(self) -> EngineStats:
        return self.core.stats

    def draining(self, seconds: float) -> None:
        pass            # no process of its own: no signal reaches the engine apart

    def close(self, timeout: float) -> None:
        self.core.stop()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def _output(self, out) -> None:
        self._front.output(out)

    def _run(self) -> None:
        self.core.run()
        self._front.stopped(self.core.fatal_error)

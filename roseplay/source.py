"""Snapshot sources: what the app talks to, so that panels do not care where data comes from.

`LiveSource` wraps a running EngineLoop and a WorkloadDriver (and optionally a
Recorder); `ReplaySource` plays a recording back on its own timeline with no model.
Both expose the same small surface: `snapshot()`, `workload()`, `paused`, `pause()`,
`resume()`, `step_once()`, and the controls (`set_knobs`, `set_scenario`, ...), which a
replay refuses with `ReadOnlyError`.
"""
from __future__ import annotations

import time

from engine.config import InvalidRequestError, SchedulerConfig
from roseplay.scenarios import SCENARIOS

RATE_STEPS = (None, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)   # req/s; None: as fast as slots free
USER_MAX_TOKENS = 96


class ReadOnlyError(RuntimeError):
    """A control that a replay cannot apply."""


class LiveSource:
    """A live engine: EngineLoop + WorkloadDriver (+ Recorder)."""

    kind = "live"

    def __init__(self, loop, driver, recorder=None):
        self.loop, self.driver, self.recorder = loop, driver, recorder
        self._knobs: SchedulerConfig = loop.engine.knobs
        self._user_ids = 0
        self._user_streams: dict = {}    # a dropped stream cancels its request: keep them
        self.tokenizer = loop.engine.tokenizer
        self.vocab_size = loop.engine.vocab_size

    # -- reading ---------------------------------------------------------------------
    def snapshot(self):
        return self.loop.snapshot()

    def workload(self) -> dict:
        self._drain_user_streams()
        d = self.driver
        return {"scenario": d.scenario_name, "concurrency": d.concurrency,
                "rate": d.request_rate, "submitted": d.submitted, "in_flight": d.num_in_flight,
                "failed": d.failed}

    @property
    def knobs(self) -> SchedulerConfig:
        return self._knobs

    @property
    def paused(self) -> bool:
        return self.loop.paused

    def position(self) -> str:
        return ""

    # -- controls ---------------------------------------------------------------------
    def _event(self, what: str, **data) -> None:
        if self.recorder is not None:
            self.recorder.event(what, **data)

    def set_knobs(self, **changes) -> SchedulerConfig:
        self._knobs = self._knobs.replace(**changes)    # validates (InvalidRequestError)
        self.loop.set_knobs(**changes)
        self._event("knobs", **changes)
        return self._knobs

    def pause(self) -> None:
        self.loop.pause()
        self._event("pause")

    def resume(self) -> None:
        self.loop.resume()
        self._event("resume")

    def step_once(self):
        self._event("step")
        return self.loop.step_once()

    def step_back(self) -> None:
        raise ReadOnlyError("a live engine cannot step back (only a replay can)")

    def clear_prefix_cache(self) -> None:
        self.loop.clear_prefix_cache()
        self._event("clear_prefix_cache")

    def set_scenario(self, name: str) -> None:
        if name not in SCENARIOS:
            raise InvalidRequestError(f"unknown scenario {name!r}")
        self.driver.set_scenario(name)
        self._event("scenario", scenario=name)

    def set_concurrency(self, n: int) -> None:
        self.driver.set_concurrency(max(1, int(n)))
        self._event("concurrency", concurrency=self.driver.concurrency)

    def set_rate(self, rate: float | None) -> None:
        self.driver.set_rate(rate)
        self._event("rate", rate=rate)

    def submit(self, text: str) -> str:
        """Submit a user prompt; raises InvalidRequestError (the engine keeps serving)."""
        from engine.request import SamplingParams
        text = text.strip()
        if not text:
            raise InvalidRequestError("prompt is empty")
        prompt: str | dict = text
        if self.tokenizer is None:   # dummy models: the UTF-8 bytes stand in for tokens
            prompt = {"prompt": text,
                      "prompt_token_ids": [b % self.vocab_size for b in text.encode()]}
        self._user_ids += 1
        rid = f"you-{self._user_ids}"
        params = SamplingParams(max_tokens=USER_MAX_TOKENS, temperature=0.8, seed=self._user_ids)
        self._user_streams[rid] = self.loop.submit(prompt, params, request_id=rid)
        self._event("submit", request_id=rid, prompt=text)
        return rid

    def _drain_user_streams(self) -> None:
        import queue
        for rid, stream in list(self._user_streams.items()):
            try:
                while not stream.get(timeout=0).finished:
                    pass
            except queue.Empty:
                continue
            del self._user_streams[rid]

    def close(self) -> None:
        self.driver.stop(timeout=5.0)
        if self.recorder is not None:
            self.recorder.close()
        self.loop.close()


class ReplaySource:
    """Plays a recording on its own clock; pause/step/step_back move along its frames."""

    kind = "replay"

    def __init__(self, path: str, speed: float = 1.0, start_paused: bool = False):
        from roseplay.record import load_recording
        self.path = path
        self.header, self.frames = load_recording(path)
        self.speed = speed
        self.index = 0
        self._paused = start_paused
        self._anchor = (time.monotonic(), self.frames[0].t)
        self.new_events: list[dict] = list(self.frames[0].events)

    @property
    def frame(self):
        return self.frames[self.index]

    def _advance(self) -> None:
        if self._paused:
            return
        start_mono, start_t = self._anchor
        now_t = start_t + (time.monotonic() - start_mono) * self.speed
        while self.index + 1 < len(self.frames) and self.frames[self.index + 1].t <= now_t:
            self.index += 1
            self.new_events.extend(self.frames[self.index].events)
        if self.index + 1 >= len(self.frames):
            self._paused = True      # the end: stay on the last frame

    def snapshot(self):
        self._advance()
        return self.frame.snapshot

    def workload(self) -> dict:
        return self.frame.workload

    def take_events(self) -> list[dict]:
        events, self.new_events = self.new_events, []
        return events

    @property
    def knobs(self) -> SchedulerConfig:
        return self.frame.snapshot.knobs

    @property
    def paused(self) -> bool:
        return self._paused

    def position(self) -> str:
        end = self.frames[-1].t
        return f"{self.frame.t:6.1f}/{end:.1f} s  frame {self.index + 1}/{len(self.frames)}"

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        if self.index + 1 >= len(self.frames):
            self.index = 0          # at the end: play again from the start
        self._paused = False
        self._anchor = (time.monotonic(), self.frame.t)

    def seek(self, index: int) -> None:
        self._paused = True
        self.index = max(0, min(len(self.frames) - 1, index))

    def step_once(self) -> None:
        self.seek(self.index + 1)
        self.new_events.extend(self.frame.events)

    def step_back(self) -> None:
        self.seek(self.index - 1)

    def _read_only(self, *args, **kwargs):
        raise ReadOnlyError("this is a replay: knobs and workload are as recorded")

    set_knobs = clear_prefix_cache = set_scenario = set_concurrency = set_rate = _read_only
    submit = _read_only

    def close(self) -> None:
        pass


def start_live(engine_kwargs: dict, *, scenario: str = "shared-prefix", concurrency: int = 16,
               rate: float | None = None, input_len: int = 64, output_len: int = 64,
               temperature: float = 0.0, seed: int = 0, record: str | None = None,
               paused: bool = False) -> LiveSource:
    """Load the model, start the engine loop and the workload driver (and a recorder)."""
    from engine.loop import EngineLoop
    from roseplay.driver import WorkloadDriver
    loop = EngineLoop(snapshot_interval=0.02, **engine_kwargs)
    if paused:
        loop.pause()
    eng = loop.engine
    workload = dict(tokenizer=eng.tokenizer, vocab_size=eng.vocab_size, input_len=input_len,
                    output_len=output_len, temperature=temperature, seed=seed)
    driver = WorkloadDriver(loop, scenario, concurrency=concurrency, request_rate=rate,
                            workload=workload, seed=seed)
    source = LiveSource(loop, driver)
    if record:
        from roseplay.record import Recorder
        source.recorder = Recorder(record, source.snapshot, source.workload,
                                   engine=dict(engine_kwargs))
    driver.start()
    return source

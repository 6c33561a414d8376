"""Snapshot sources: what the app talks to, so that panels do not care where data comes from.

`LiveSource` wraps a running EngineLoop and a WorkloadDriver (and optionally a
Recorder); `ReplaySource` plays a recording back on its own timeline with no model.
Both expose the same small surface: `snapshot()`, `workload()`, `paused`, `pause()`,
`resume()`, `step_once()`, and the controls (`set_knobs`, `set_scenario`, ...), which a
replay refuses with `ReadOnlyError`.
"""
from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING

from engine.config import InvalidRequestError, SchedulerConfig
from roseplay.workload.own_prompts import OwnPrompts, own_request_id
from roseplay.workload.scenarios import SCENARIOS

if TYPE_CHECKING:      # the client API both transports implement
    from engine.front.api import EngineAPI

RATE_STEPS = (None, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)   # req/s; None: as fast as slots free
USER_MAX_TOKENS = 96
# 1 in LOGPROBS_EVERY generated requests asks for its top logprobs (the Selected panel's
# next-token distribution); the rest keep the fast sampling path (and speculate)
LOGPROBS_EVERY = 8


class ReadOnlyError(RuntimeError):
    """A control that a replay cannot apply."""


class LiveSource:
    """A live engine: EngineLoop + WorkloadDriver (+ Recorder)."""

    kind = "live"

    def __init__(self, loop: EngineAPI, driver, recorder=None):
        self.loop, self.driver, self.recorder = loop, driver, recorder
        self._knobs: SchedulerConfig = loop.knobs
        self._user_ids = 0
        self.own = OwnPrompts()          # the typed prompts' streams and traces
        self.info = loop.info            # EngineInfo: never reach into loop.engine here
        self.tokenizer = loop.tokenizer
        self.vocab_size = self.info.vocab_size

    # -- reading ---------------------------------------------------------------------
    def snapshot(self):
        """The engine's snapshot, with the typed prompts' traces (roseplay/workload/
        own_prompts.py)."""
        return self.own.merge(self.loop.snapshot())

    def workload(self) -> dict:
        self.own.drain()
        d, dp = self.driver, self.replicas()
        out = {"scenario": d.scenario_name, "concurrency": d.concurrency,
               "rate": d.request_rate, "submitted": d.submitted, "in_flight": d.num_in_flight,
               "failed": d.failed, "refused": d.refused, "last_error": d.last_error}
        if dp is not None:
            out.update(routing_policy=dp.router.policy, replicas=dp.size)
        return out

    @property
    def knobs(self) -> SchedulerConfig:
        return self._knobs

    @property
    def paused(self) -> bool:
        return self.loop.paused

    def position(self) -> str:
        """The recorder's state, when recording (it stops at its size limit, or when a
        write fails: disk full)."""
        rec = self.recorder
        if rec is None:
            return ""
        if rec.error:
            return f"REC stopped: {rec.error}  "
        if rec.full:
            return f"REC stopped: {rec.max_bytes >> 20} MB limit  "
        return f"● REC {rec.file_bytes() / 1e6:.1f} MB  "     # the file, not the JSON in it

    def replicas(self):
        """The data-parallel front (engine/front/dp_client.py) when the engine runs
        replicas, else None."""
        return self.loop if hasattr(self.loop, "replica_snapshots") else None

    # -- controls ---------------------------------------------------------------------
    def _event(self, what: str, **data) -> None:
        if self.recorder is not None:
            self.recorder.event(what, **data)

    def record_event(self, what: str, **data) -> None:
        """An app action the recording keeps (a guide picked: its replay marks the plots)."""
        self._event(what, **data)

    def set_knobs(self, **changes) -> SchedulerConfig:
        self._knobs = self.loop.set_knobs(**changes)    # validates (InvalidRequestError)
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
        self.loop.reset_prefix_cache()
        self._event("clear_prefix_cache")

    def set_routing_policy(self, policy: str) -> None:
        """The data-parallel router's policy, live (InvalidRequestError: one engine, or
        an unknown policy)."""
        dp = self.replicas()
        if dp is None:
            raise InvalidRequestError("one engine: routing needs roseplay "
                                      "--data-parallel-size 2 or more")
        dp.set_routing_policy(policy)
        self._event("routing", policy=policy)

    def cancel_workload(self) -> None:
        """Cancel the workload's requests in flight (typed prompts stay)."""
        self.driver.cancel_in_flight()
        self._event("cancel_workload")

    def set_scenario(self, name: str) -> None:
        """Refused (InvalidRequestError) for a scenario whose longest request the pool
        can never hold: the engine would refuse its requests, one by one."""
        if name not in SCENARIOS:
            raise InvalidRequestError(f"unknown scenario {name!r}")
        check_fits(name, self.info, self.driver.workload)
        self.driver.set_scenario(name)
        self.driver.resume()     # an attached app's driver waits for this pick (start_live)
        self._event("scenario", scenario=name)

    def set_concurrency(self, n: int) -> None:
        validate_workload(concurrency=n)
        self.driver.set_concurrency(n)
        self._event("concurrency", concurrency=self.driver.concurrency)

    def set_rate(self, rate: float | None) -> None:
        validate_workload(rate=rate)
        self.driver.set_rate(rate)
        self._event("rate", rate=rate)

    def submit(self, text: str, priority: int = 0, sampling: dict | None = None) -> str:
        """Submit a user prompt (with its scheduling priority: lower goes first, and
        SamplingParams fields over the defaults); raises InvalidRequestError (the engine
        keeps serving). It asks for the top logprobs, the model's own too (raw_logprobs:
        the Selected panel shows both), and for its token trace (the scrub, key w)."""
        from engine.request import SamplingParams
        from roseplay.workload.driver import TOP_LOGPROBS
        text = text.strip()
        if not text:
            raise InvalidRequestError("prompt is empty")
        prompt: str | dict = text
        if self.tokenizer is None:   # dummy models: the UTF-8 bytes stand in for tokens
            prompt = {"prompt": text,
                      "prompt_token_ids": [b % self.vocab_size for b in text.encode()]}
        self._user_ids += 1
        rid = own_request_id(self._user_ids)
        params = SamplingParams(**{"max_tokens": USER_MAX_TOKENS, "temperature": 0.8,
                                   "seed": self._user_ids, **(sampling or {}),
                                   "logprobs": TOP_LOGPROBS, "raw_logprobs": True,
                                   "token_trace": True})
        self.own.add(rid, self.loop.submit(prompt, params, request_id=rid, priority=priority))
        self._event("submit", request_id=rid, prompt=text, priority=priority)
        return rid

    def close(self) -> None:
        self.driver.stop(timeout=5.0)
        if self.recorder is not None:
            self.recorder.close()
        self.loop.close()


class ReplaySource:
    """Plays a recording on its own clock; pause/step/step_back/seek move along its frames."""

    kind = "replay"
    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

    def __init__(self, path: str, speed: float = 1.0, start_paused: bool = False):
        from roseplay.workload.replay import Recording
        if not speed > 0:
            raise ValueError(f"replay speed must be > 0, got {speed}")
        self.path = path
        self.recording = Recording(path)
        self.header = self.recording.header
        self.speed = speed
        self.index = 0
        self._paused = start_paused
        self._anchor = (time.monotonic(), self.recording.entries[0].t)
        self.new_events: list[dict] = list(self.recording.entries[0].events)

    @property
    def frame(self):
        return self.recording[self.index]

    @functools.cached_property
    def tokenizer(self):
        """The recorded token pieces (record_text.py RecordedVocab); None if it has none."""
        from roseplay.workload.record_text import RecordedVocab
        pieces = self.recording.pieces
        return RecordedVocab(pieces) if pieces else None

    def _advance(self) -> None:
        if self._paused:
            return
        start_mono, start_t = self._anchor
        now_t = start_t + (time.monotonic() - start_mono) * self.speed
        entries = self.recording.entries
        while self.index + 1 < len(entries) and entries[self.index + 1].t <= now_t:
            self.index += 1
            self.new_events.extend(entries[self.index].events)
        if self.at_end:
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

    @property
    def at_end(self) -> bool:
        """On the last frame: no later frame comes (until played again)."""
        return self.index + 1 >= len(self.recording)

    def position(self) -> str:
        entries = self.recording.entries
        speed = f"  ×{self.speed:g}" if self.speed != 1 else ""
        cut = "  (cut off here)" if self.recording.end_note else ""
        return (f"{entries[self.index].t:6.1f}/{entries[-1].t:.1f} s  frame {self.index + 1}/"
                f"{len(entries)}{cut if self.at_end else ''}{speed}")

    def notice(self) -> str | None:
        """Where a damaged or cut-off recording ends (shown once when the app opens)."""
        return self.recording.describe_end()

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        if self.at_end:
            self.index = 0          # at the end: play again from the start
        self._paused = False
        self._anchor = (time.monotonic(), self.recording.entries[self.index].t)

    def seek(self, index: int) -> None:
        """Jump to a frame; playing goes on from there (a paused replay stays paused)."""
        self.index = max(0, min(len(self.recording) - 1, index))
        self._anchor = (time.monotonic(), self.recording.entries[self.index].t)

    def seek_by(self, seconds: float) -> None:
        entries = self.recording.entries
        self.seek(self.recording.index_at(entries[self.index].t + seconds))

    def set_speed(self, speed: float) -> None:
        if not speed > 0:
            raise ValueError(f"replay speed must be > 0, got {speed}")
        self.speed = speed
        self._anchor = (time.monotonic(), self.recording.entries[self.index].t)

    def step_once(self) -> None:
        self._paused = True
        self.seek(self.index + 1)
        self.new_events.extend(self.recording.entries[self.index].events)

    def step_back(self) -> None:
        self._paused = True
        self.seek(self.index - 1)

    def _read_only(self, *args, **kwargs):
        raise ReadOnlyError("this is a replay: knobs and workload are as recorded")

    set_knobs = clear_prefix_cache = set_scenario = set_concurrency = set_rate = _read_only
    submit = set_routing_policy = _read_only

    def replicas(self):
        """The recorded data-parallel front at this frame (record_replicas.py), or None."""
        return self.frame.replicas

    def close(self) -> None:
        pass


def validate_workload(*, scenario: str | None = None, concurrency: int | None = 1,
                      rate: float | None = None, input_len: int = 1, output_len: int = 1,
                      temperature: float = 0.0) -> None:
    """Raise InvalidRequestError for a workload the driver would silently not serve."""
    def whole(name, value, low):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidRequestError(f"{name} must be an integer >= {low}, got {value!r}")
    if scenario is not None and scenario not in SCENARIOS:
        raise InvalidRequestError(
            f"unknown scenario {scenario!r}; scenarios: {', '.join(SCENARIOS)}")
    if concurrency is not None:
        whole("concurrency", concurrency, 1)
    whole("input_len", input_len, 1)
    whole("output_len", output_len, 1)
    for name, value, strict in (("rate", rate, True), ("temperature", temperature, False)):
        if value is None and name == "rate":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value) or value < 0 or (strict and value == 0):
            raise InvalidRequestError(f"{name} must be a number {'>' if strict else '>='} 0, "
                                      f"got {value!r}")


def start_live(engine_kwargs: dict, *, scenario: str = "shared-prefix", concurrency: int = 16,
               rate: float | None = None, input_len: int = 64, output_len: int = 64,
               temperature: float = 0.0, seed: int = 0, record: str | None = None,
               paused: bool = False, connect: str | list[str] | None = None,
               in_process: bool = False) -> LiveSource:
    """Check the workload, start (or attach to) the engine and the workload driver (and a
    recorder). The engine runs in its own process unless `in_process`: the app's
    rendering then never shares the engine's GIL (docs/ARCHITECTURE.md)."""
    validate_workload(scenario=scenario, concurrency=concurrency, rate=rate,
                      input_len=input_len, output_len=output_len, temperature=temperature)
    from roseplay.workload.driver import WorkloadDriver
    loop = make_engine(engine_kwargs, connect, in_process)
    workload = dict(tokenizer=loop.tokenizer, vocab_size=loop.info.vocab_size, input_len=input_len,
                    output_len=output_len, temperature=temperature, seed=seed)
    if not connect:         # (attached: no load of ours until a scenario is picked)
        try:
            check_fits(scenario, loop.info, workload)
        except InvalidRequestError:
            loop.close()
            raise
    if paused:
        loop.pause()
    driver = WorkloadDriver(loop, scenario, concurrency=concurrency, request_rate=rate,
                            workload=workload, seed=seed, logprobs_every=LOGPROBS_EVERY)
    source = LiveSource(loop, driver)
    if connect:
        driver.pause()          # watch what the other process sends; `s` adds our own load
    if record:
        from roseplay.workload.record import Recorder
        source.recorder = Recorder(record, source.snapshot, source.workload,
                                   tokenizer=loop.tokenizer, replicas_fn=source.replicas,
                                   engine=dict(engine_kwargs))
    driver.start()
    return source


def check_fits(scenario: str, info, workload: dict) -> None:
    """InvalidRequestError if the scenario's longest request can never fit the pool
    (roseplay/workload/fit.py: the prompts as this engine's tokenizer counts them)."""
    from roseplay.workload.fit import pool_problem
    problem = pool_problem(scenario, info.num_blocks, info.block_size, **workload)
    if problem:
        raise InvalidRequestError(problem)


def make_engine(engine_kwargs: dict, connect: str | list[str] | None = None,
                in_process: bool = False):
    """The engine the app talks to: attached (to several engines: a data-parallel front
    over them, with the routing knobs given), in its own process, or on a thread."""
    if in_process:
        from engine.front.loop import EngineLoop
        return EngineLoop(snapshot_interval=0.02, **engine_kwargs)
    if isinstance(connect, list) and len(connect) > 1:
        from engine.front.dp_attach import FRONT_KNOBS
        from engine.front.dp_client import DPClient
        return DPClient(engine_addresses=connect, label="tui", **{
            k: v for k, v in engine_kwargs.items() if k in FRONT_KNOBS})
    if connect:
        from engine.front.client import EngineClient
        return EngineClient(connect=connect[0] if isinstance(connect, list) else connect,
                            label="tui")
    from engine.front.dp_client import engine_front
    return engine_front(label="tui", **engine_kwargs)

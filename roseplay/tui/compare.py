"""`roseplay --compare KNOB=A,B`: two engines, one workload stream, side by side.

`CompareSource` holds two LiveSources (two engine processes) whose drivers read one
`SharedWorkload` (roseplay/workload/shared.py): the same prompts in the same order, and
with a rate the same arrival times. The compared knob is any documented knob of
engine/config.py (a live SchedulerConfig knob, a policy knob, or a start-time one such
as num_blocks): side A starts with the first value, side B with the second. Every other
control applies to both sides; changing the compared knob itself is refused (it is
what the view compares). `--record PATH` writes one recording per side (PATH and its
`.B` sibling, each header naming the other); `--replay` of either plays both.
"""
from __future__ import annotations

import os
import threading

from engine.config import InvalidRequestError
from roseplay.cli_flags import field_by_name, parse_knob_value
from roseplay.workload.source import LiveSource, ReplaySource

SIDES = ("A", "B")


def parse_compare(text: str) -> tuple[str, list]:
    """"enable_prefix_caching=true,false" -> ("enable_prefix_caching", [True, False])."""
    name, sep, values = str(text).partition("=")
    if not sep or not values:
        raise ValueError(f"--compare expects KNOB=A,B, got {text!r}")
    try:
        name = field_by_name(name.strip()).name
    except ValueError as exc:
        raise ValueError(f"--compare: {exc}") from None
    parsed = [parse_knob_value(name, v.strip()) for v in values.split(",")]
    if len(parsed) != 2:
        raise ValueError(f"--compare compares two values, got {len(parsed)}")
    if parsed[0] == parsed[1]:
        raise ValueError(f"--compare: both sides would have {name}={parsed[0]}")
    return name, parsed


def pair_path(path: str) -> str:
    """Side B's recording next to side A's: run.jsonl.gz -> run.B.jsonl.gz."""
    folder, base = os.path.split(path)
    stem, dot, ext = base.partition(".")
    return os.path.join(folder, f"{stem}.B{dot}{ext}" if dot else f"{base}.B")


class CompareSource:
    """Two live sides; the controls of LiveSource, applied to both."""

    kind = "live"

    def __init__(self, knob: str, values: list, sides: list[LiveSource], workload):
        self.knob, self.values, self.sides, self.shared = knob, values, sides, workload
        self.info = sides[0].info
        self.tokenizer = sides[0].tokenizer

    def labels(self) -> list[str]:
        return [f"{s} · {self.knob}={fmt(v)}" for s, v in zip(SIDES, self.values)]

    def snapshots(self) -> list:
        return [s.snapshot() for s in self.sides]

    def snapshot(self):
        return self.sides[0].snapshot()

    def workload(self, side: int = 0) -> dict:
        """The shared workload as `side` serves it (its own requests in flight)."""
        w = self.sides[side].workload()
        w.update(scenario=self.shared.scenario, rate=self.shared.rate)
        return w

    @property
    def knobs(self):
        return self.sides[0].knobs

    @property
    def paused(self) -> bool:
        return self.sides[0].paused

    def position(self) -> str:
        return self.sides[0].position()

    # -- controls: both sides ---------------------------------------------------------------
    def _both(self, name: str, *args, **kwargs):
        return [getattr(s, name)(*args, **kwargs) for s in self.sides]

    def set_knobs(self, **changes):
        if self.knob in changes:
            a, b = (fmt(v) for v in self.values)
            raise InvalidRequestError(f"{self.knob} is what this view compares (A {a}, B {b}); "
                                      f"the other knobs change on both sides")
        for side in self.sides:
            side.loop.knobs.replace(**changes)          # validate before changing either
        return self._both("set_knobs", **changes)[0]

    def pause(self) -> None:
        self._both("pause")

    def resume(self) -> None:
        self._both("resume")

    def step_once(self):
        return self._both("step_once")[0]

    def step_back(self) -> None:
        self.sides[0].step_back()

    def clear_prefix_cache(self) -> None:
        self._both("clear_prefix_cache")

    def cancel_workload(self) -> None:
        self._both("cancel_workload")

    def set_scenario(self, name: str) -> None:
        from roseplay.workload.scenarios import SCENARIOS
        if name not in SCENARIOS:
            raise InvalidRequestError(f"unknown scenario {name!r}")
        self.shared.set_scenario(name)
        for side in self.sides:
            side._event("scenario", scenario=name)

    def set_rate(self, rate: float | None) -> None:
        from roseplay.workload.source import validate_workload
        validate_workload(rate=rate)
        self.shared.set_rate(rate)
        for side in self.sides:
            side._event("rate", rate=rate)

    def set_concurrency(self, n: int) -> None:
        self._both("set_concurrency", n)

    def record_event(self, what: str, **data) -> None:
        self._both("record_event", what, **data)

    def submit(self, text: str, priority: int = 0, sampling: dict | None = None) -> str:
        return self._both("submit", text, priority=priority, sampling=sampling)[0]

    def close(self) -> None:
        """Stop both sides at once (each joins its engine process)."""
        threads = [threading.Thread(target=s.close) for s in self.sides]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)


class CompareReplaySource:
    """Both recordings of a compare session on one clock: pause, step and seek move both
    sides to the same recorded time."""

    kind = "replay"
    SPEEDS = ReplaySource.SPEEDS

    def __init__(self, path: str, speed: float = 1.0, start_paused: bool = False):
        first = ReplaySource(path, speed=speed, start_paused=start_paused)
        meta = first.header.get("compare")
        if not is_compare_meta(meta):
            raise ValueError(f"{path} is not a recording of a compare session")
        other = os.path.join(os.path.dirname(os.path.abspath(path)), meta["pair"])
        second = ReplaySource(other, speed=speed, start_paused=start_paused)
        self.sides = [first, second] if meta["side"] == 0 else [second, first]
        self.knob, self.values = meta["knob"], list(meta["values"])
        self.info = None

    labels = CompareSource.labels

    @property
    def lead(self) -> ReplaySource:
        return self.sides[0]

    @property
    def recording(self):
        return self.lead.recording

    @property
    def tokenizer(self):
        return self.lead.tokenizer

    @property
    def speed(self) -> float:
        return self.lead.speed

    @property
    def paused(self) -> bool:
        return self.lead.paused

    @property
    def at_end(self) -> bool:
        return self.lead.at_end

    @property
    def knobs(self):
        return self.lead.knobs

    def snapshots(self) -> list:
        snap = self.lead.snapshot()
        self._follow()
        return [snap, self.sides[1].frame.snapshot]

    def snapshot(self):
        return self.snapshots()[0]

    def _follow(self) -> None:
        """Side B shows its frame at side A's recorded time."""
        t = self.lead.recording.entries[self.lead.index].t
        self.sides[1].index = self.sides[1].recording.index_at(t)

    def workload(self, side: int = 0) -> dict:
        return self.sides[side].frame.workload if side else self.lead.workload()

    def position(self) -> str:
        return self.lead.position()

    def notice(self) -> str | None:
        return self.lead.notice() or self.sides[1].notice()

    def take_events(self) -> list[dict]:
        self.sides[1].take_events()
        return self.lead.take_events()

    def _lead(self, name: str, *args):
        getattr(self.lead, name)(*args)
        self._follow()

    def pause(self) -> None:
        self._lead("pause")

    def resume(self) -> None:
        self._lead("resume")

    def step_once(self) -> None:
        self._lead("step_once")

    def step_back(self) -> None:
        self._lead("step_back")

    def seek(self, index: int) -> None:
        self._lead("seek", index)

    def seek_by(self, seconds: float) -> None:
        self._lead("seek_by", seconds)

    def set_speed(self, speed: float) -> None:
        self._lead("set_speed", speed)

    set_knobs = clear_prefix_cache = set_scenario = set_concurrency = set_rate = \
        submit = ReplaySource._read_only

    def close(self) -> None:
        pass


def is_compare_meta(meta) -> bool:
    """A recording header's `compare` entry, checked as untrusted data."""
    return (isinstance(meta, dict) and isinstance(meta.get("knob"), str)
            and isinstance(meta.get("values"), list) and len(meta["values"]) == 2
            and meta.get("side") in (0, 1) and isinstance(meta.get("pair"), str)
            and os.path.basename(meta["pair"]) == meta["pair"] and meta["pair"] not in ("", ".", ".."))


def is_compare_recording(path: str) -> bool:
    from roseplay.workload.replay import Recording
    try:
        return is_compare_meta(Recording(path).header.get("compare"))
    except (OSError, ValueError):
        return False


def fmt(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def start_compare(engine_kwargs: dict, knob: str, values: list, *, scenario: str,
                  concurrency: int, rate: float | None, input_len: int, output_len: int,
                  temperature: float, seed: int = 0, record: str | None = None,
                  paused: bool = False, in_process: bool = False) -> CompareSource:
    """Start both engines (concurrently), one shared workload and a driver per side."""
    from roseplay.workload.driver import WorkloadDriver
    from roseplay.workload.shared import SharedWorkload
    from roseplay.workload.source import make_engine, validate_workload
    validate_workload(scenario=scenario, concurrency=concurrency, rate=rate,
                      input_len=input_len, output_len=output_len, temperature=temperature)
    loops = _start_engines([dict(engine_kwargs, **{knob: v}) for v in values], in_process,
                           make_engine)
    if paused:
        for loop in loops:
            loop.pause()
    shared = SharedWorkload(scenario, rate=rate, seed=seed, tokenizer=loops[0].tokenizer,
                            vocab_size=loops[0].info.vocab_size, input_len=input_len,
                            output_len=output_len, temperature=temperature)
    sides = [LiveSource(loop, WorkloadDriver(loop, shared.reader(), concurrency=concurrency,
                                             seed=seed, id_prefix="c-", epoch=shared.epoch))
             for loop in loops]
    source = CompareSource(knob, values, sides, shared)
    if record:
        _attach_recorders(source, record, engine_kwargs)
    for side in sides:
        side.driver.scenario_name = scenario
        side.driver.start()
    return source


def _start_engines(configs: list[dict], in_process: bool, make_engine) -> list:
    """Both engines. Engine processes load at once: both are spawned first (EngineLaunch),
    then each client takes its process over; in-process engines, and data-parallel fronts
    (each starts its replicas at once), start one after the other. If one fails,
    everything started is stopped."""
    if in_process or any(cfg.get("data_parallel_size", 1) > 1 for cfg in configs):
        first = make_engine(configs[0], None, in_process)
        try:
            return [first, make_engine(configs[1], None, in_process)]
        except BaseException:
            first.close()
            raise
    from engine.front.client import EngineClient
    from engine.ipc.launch import EngineLaunch
    launches, clients = [], []
    try:
        for cfg in configs:
            launches.append(EngineLaunch(cfg))
        for i, (launch, cfg) in enumerate(zip(launches, configs)):
            clients.append(EngineClient(label=f"tui-{'ab'[i]}", launch=launch, **cfg))
        return clients
    except BaseException:
        for client in clients:
            client.close()
        for launch in launches[len(clients):]:
            launch.abort()
        raise


def _attach_recorders(source: CompareSource, path: str, engine_kwargs: dict) -> None:
    from roseplay.workload.record import Recorder
    paths = [path, pair_path(path)]
    for i, side in enumerate(source.sides):
        meta = dict(knob=source.knob, values=source.values, side=i,
                    pair=os.path.basename(paths[1 - i]))
        side.recorder = Recorder(paths[i], side.snapshot, lambda i=i: source.workload(i),
                                 tokenizer=source.tokenizer, compare=meta,
                                 engine=dict(engine_kwargs, **{source.knob: source.values[i]}))

"""One workload stream read by several drivers: the same prompts, order and arrivals.

`roseplay --compare` feeds two engines from one `SharedWorkload`: each driver reads
its own `reader()`, and item i is the same for every reader (the same prompt, sampling
parameters and arrival offset), however far apart the readers are. Nothing is
buffered: scenarios build item i from its index (roseplay/workload/scenarios.py), and arrival
offsets come from a seeded generator that each reader replays, so memory holds only
the list of *segments* (a scenario or rate change starts one at the leading reader's
next item), trimmed once every reader has passed them.

Closed loop (no rate): items carry no arrival and each driver sends when its engine
frees a slot, as vLLM's --max-concurrency does; each side then runs at its own pace.
Open loop (a rate): arrival offsets are stamped here, from the shared epoch, so both
sides receive every request at the same instant.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, replace
from typing import Iterator

from roseplay.workload.items import WorkItem, make_spec
from roseplay.workload.scenarios import get_scenario


@dataclass(frozen=True)
class Segment:
    start: int                  # the first item index of this segment
    scenario: str
    rate: float | None          # Poisson req/s; None: closed loop (no arrival stamps)
    t0: float                   # arrival offset (s) of item `start` when rate is set
    key: int                    # seeds this segment's arrival gaps
    base: int                   # the index where this scenario began (its item 0)


class SharedWorkload:
    """`reader()` gives an endless iterator of WorkItems; every reader gets the same
    sequence. `set_scenario` / `set_rate` take effect from the leading reader's next
    item for every reader."""

    def __init__(self, scenario: str, *, rate: float | None = None, seed: int = 0,
                 **spec_kwargs):
        get_scenario(scenario)                       # ValueError if unknown
        self.spec = make_spec(seed=seed, **spec_kwargs)
        self.seed = seed
        self.epoch = time.perf_counter()             # drivers count arrivals from here
        self._lock = threading.Lock()
        self._segments = [Segment(0, scenario, rate, 0.0, 0, 0)]
        self._cursors: list[int] = []                # next index of each reader
        self._keys = 0

    # -- controls (any thread) ------------------------------------------------------------
    @property
    def scenario(self) -> str:
        return self._segments[-1].scenario

    @property
    def rate(self) -> float | None:
        return self._segments[-1].rate

    def set_scenario(self, name: str) -> None:
        get_scenario(name)
        self._new_segment(scenario=name)

    def set_rate(self, rate: float | None) -> None:
        self._new_segment(rate=rate)

    def _new_segment(self, **change) -> None:
        with self._lock:
            last = self._segments[-1]
            start = max(self._cursors, default=0)
            self._keys += 1
            scenario = change.get("scenario", last.scenario)
            seg = Segment(start, scenario, change.get("rate", last.rate),
                          time.perf_counter() - self.epoch, self._keys,
                          start if "scenario" in change else last.base)
            if self._segments[-1].start == start:    # nothing read since the last change
                self._segments[-1] = seg
            else:
                self._segments.append(seg)
            self._trim()

    def _trim(self) -> None:
        """Drop segments every reader has passed (the list stays short)."""
        low = min(self._cursors, default=0)
        while len(self._segments) > 1 and self._segments[1].start <= low:
            self._segments.pop(0)

    # -- readers ----------------------------------------------------------------------------
    def reader(self) -> Iterator[WorkItem]:
        with self._lock:
            slot = len(self._cursors)
            self._cursors.append(0)
        return self._read(slot)

    def _read(self, slot: int) -> Iterator[WorkItem]:
        seg, rng, t = None, None, 0.0
        i = 0
        while True:
            with self._lock:
                self._cursors[slot] = i + 1
                nxt = next((s for s in reversed(self._segments) if s.start <= i), None)
                self._trim()
            if nxt is not None and nxt is not seg:
                seg = nxt
                rng, t = random.Random(f"{self.seed}:arrivals:{seg.key}"), seg.t0
            elif seg.rate is not None:
                t += rng.expovariate(seg.rate)
            item = get_scenario(seg.scenario).make(self.spec, i - seg.base)
            if seg.rate is not None:
                item = replace(item, arrival=t)     # keeps its priority
            yield item
            i += 1

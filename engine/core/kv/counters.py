"""The engine's cumulative counters, mutable: the block pool, the prefix index, the
scheduler and the stats recorder each add to their own fields; snapshots freeze a copy
as EngineCounters (engine/snapshot.py)."""
from __future__ import annotations

import dataclasses

from engine.snapshot import EngineCounters

_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(EngineCounters))


class Counters:
    """The engine's cumulative counters: ONE mutable owner, shared by the block pool,
    the prefix index, the scheduler and the stats recorder (each adds to its own
    fields); snapshots freeze a copy as EngineCounters."""
    __slots__ = _COUNTER_NAMES

    def __init__(self):
        for name in _COUNTER_NAMES:
            setattr(self, name, 0)

    def freeze(self) -> EngineCounters:
        return EngineCounters(**{n: getattr(self, n) for n in _COUNTER_NAMES})

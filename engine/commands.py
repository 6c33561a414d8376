"""The engine core's controls: one typed command set for both transports.

A client sends a `CoreRequest` (engine/outputs.py) or one of these; the core loop applies
each between steps in `CoreLoop.handle` (engine/core/core_loop.py), whether it came from
a thread of this process (engine/ipc/inproc.py) or off the engine process's sockets
(engine/ipc/protocol.py decodes them, typed, into these same Structs). A new control is
a Struct here, its case in `CoreLoop.handle` and its method in the front's CoreControls
(engine/front/api.py: EngineClient and DPClient send it; nothing else changes).

`StepOnce` and `Barrier` are answered: the transport hands `handle` a reply callback
(the engine process turns it into StepDone / BarrierDone for the sender).
"""
from __future__ import annotations

import msgspec

from engine.config import KnobChanges


class Abort(msgspec.Struct, tag=True):
    """End a request (engine.codes REASON_*: cancelled, stop, error)."""
    request_id: str
    reason: str = "cancelled"
    error: str | None = None


class SetKnobs(msgspec.Struct, tag=True):
    """Change live knobs: only the fields set (the rest UNSET), applied at the next step,
    so that clients changing different knobs never undo each other. Decoding checks
    their types; the core checks their bounds (SchedulerConfig) once, when it applies them."""
    knobs: KnobChanges


class SetPaused(msgspec.Struct, tag=True):
    paused: bool


class StepOnce(msgspec.Struct, tag=True):
    """Pause (if running) and run exactly one step; replied to after it."""
    token: int = 0


class ResetPrefixCache(msgspec.Struct, tag=True):
    """Forget every cached prefix (vLLM's reset_prefix_cache)."""


class ResetPeakUsage(msgspec.Struct, tag=True):
    """Restart the peak-KV-usage watermark."""


class Barrier(msgspec.Struct, tag=True):
    """Replied to when the core is idle, with a snapshot taken after its last step."""
    token: int = 0


COMMANDS = (Abort, SetKnobs, SetPaused, StepOnce, ResetPrefixCache, ResetPeakUsage, Barrier)
Command = Abort | SetKnobs | SetPaused | StepOnce | ResetPrefixCache | ResetPeakUsage | Barrier

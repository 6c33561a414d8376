"""EngineLoop: the EngineClient over an engine on a thread of this process.

The same front as over an engine process (engine/front/client.py), with the in-process
transport (engine/ipc/inproc.py: the core loop on a background thread); step outputs
go through the front's OutputProcessor on that thread. `engine` and `core` are the
in-process engine and its loop, for callers that inspect them (tests, a profiler).
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.front.client import EngineClient
from engine.front.processor import StreamEvent
from engine.front.stream import RequestStream
from engine.ipc.inproc import InprocTransport, LLMEngine
from engine.outputs import EngineInfo

__all__ = ["EngineLoop", "RequestStream", "StreamEvent", "EngineInfo"]


class EngineLoop(EngineClient):
    def __init__(self, engine: LLMEngine | None = None, *, config: EngineConfig | None = None,
                 snapshot_interval: float = 0.02, **kwargs):
        super().__init__(InprocTransport(engine, config=config,
                                         snapshot_interval=snapshot_interval, **kwargs))

    @property
    def engine(self) -> LLMEngine:
        return self.transport.engine

    @property
    def core(self):
        return self.transport.core

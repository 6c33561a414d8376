"""The core side of the in-process transports: `LLM` steps an LLMEngine on the caller's
thread, `EngineLoop` runs a CoreLoop on a thread of its own. The front reaches the core
only through ipc/ (tests/engine/test_import_rules.py), as EngineClient reaches it over ZMQ."""
from __future__ import annotations

from engine.core.core import LLMEngine
from engine.core.core_loop import CoreLoop

__all__ = ["LLMEngine", "CoreLoop"]

"""roseplay's inference engine: paged KV cache, prefix cache, chunked prefill.

The engine never imports textual or rich (the UI lives in `roseplay`). The torch-backed
parts (LLM, LLMEngine, EngineLoop) load lazily, so `engine.config` and `engine.snapshot`
can be imported without torch (the TUI's replay mode needs no model).
"""
from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig
from engine.request import SamplingParams
from engine.request_output import CompletionOutput, RequestMetrics, RequestOutput
from engine.structured_outputs import StructuredOutputsParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SchedulerConfig", "SamplingParams",
           "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "InvalidRequestError",
           "EngineLoop", "RequestStream"]

_LAZY = {"LLM": "engine.front.llm", "LLMEngine": "engine.core.core",
         "EngineLoop": "engine.front.loop", "RequestStream": "engine.front.loop"}


def __getattr__(name):  # torch-backed parts load on first use
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)

"""roseplay's inference engine: paged KV cache, prefix cache, chunked prefill.

The engine never imports textual or rich (the UI lives in `roseplay`).
"""
from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig
from engine.core import LLMEngine
from engine.llm import LLM
from engine.request import CompletionOutput, RequestMetrics, RequestOutput, SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SchedulerConfig", "SamplingParams",
           "RequestOutput", "CompletionOutput", "RequestMetrics", "InvalidRequestError",
           "EngineLoop", "RequestStream"]


def __getattr__(name):  # the threaded front loads lazily
    if name in ("EngineLoop", "RequestStream"):
        from engine import loop
        return getattr(loop, name)
    raise AttributeError(name)

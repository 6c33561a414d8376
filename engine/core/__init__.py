"""The engine core: LLMEngine, the core loop, scheduler, KV manager (runs in the engine process)."""

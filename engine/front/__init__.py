"""The client side: LLM, EngineClient, EngineLoop and the request/output processing they share."""

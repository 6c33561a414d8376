"""Small helpers shared by tests that drive the engine core directly."""
from engine.processor import InputProcessor


def add_request(eng, prompt, params=None, request_id=None, priority=0):
    """Validate like the front does and queue on the core; returns the core Request."""
    creq, _ = InputProcessor.for_engine(eng).process(prompt, params, request_id, priority)
    return eng.add(creq)

"""The engine's one error for what a caller gave wrong."""


class InvalidRequestError(ValueError):
    """A request, sampling parameter, knob or model name that the engine refuses."""

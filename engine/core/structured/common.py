"""What both grammar backends share (guidance.py, xgrammar_backend.py)."""
from __future__ import annotations


class GrammarError(ValueError):
    """The grammar library refused a request's constraint (invalid, unsupported, or over
    its limits): the request ends with a 400."""


def no_additional_properties(schema):
    """vLLM's disable_additional_properties: every object schema without its own
    additionalProperties takes none."""
    if isinstance(schema, dict):
        schema = {k: no_additional_properties(v) for k, v in schema.items()}
        if (schema.get("type") == "object" or "properties" in schema) \
                and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [no_additional_properties(v) for v in schema]
    return schema


def reason(exc: Exception) -> str:
    """A library's error as one bounded line of text."""
    return (str(exc).strip() or type(exc).__name__)[:500]

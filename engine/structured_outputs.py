"""Structured outputs: what a request asks its tokens to obey (vLLM's StructuredOutputsParams).

Exactly one constraint per request: `json` (a JSON schema, a dict or its text), `regex`,
`choice` (one of these strings), `grammar` (Lark, or GBNF/EBNF as llama.cpp writes it) or
`json_object` (any JSON object, OpenAI's response_format json_object). The engine core
compiles it off the step loop (engine/core/structured/) and masks every sampled token to
what the grammar allows; docs/STRUCTURED_OUTPUTS.md.

Checked here, in the front and again as the engine process decodes it: the kind, the
types, and the size (MAX_GRAMMAR_BYTES: compiling is the engine's work, so a spec's
size is bounded before it gets there). Whether the grammar library reads the spec is
checked by the front at submit (engine/grammars.py); whether it compiles is the engine's
to say: a failure ends the request with an error that starts with GRAMMAR_ERROR (the
server answers it with a 400 naming the request field the constraint came from).
"""
from __future__ import annotations

import json

import msgspec
from msgspec.structs import force_setattr

from engine.errors import InvalidRequestError

MAX_GRAMMAR_BYTES = 128 * 1024     # a spec's text (schema, regex, grammar, choices): a
#                                    real tool list or schema is a few KiB; compiling is
#                                    the engine's work, so a bigger one is refused here
MAX_CHOICES = 1024                 # `choice` strings
GRAMMAR_ERROR = "structured output grammar"   # the prefix of an engine's compile error
KINDS = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputsParams(msgspec.Struct, frozen=True, omit_defaults=True,
                              forbid_unknown_fields=True):
    """vLLM's field names. A `json` dict is kept as its JSON text (sorted keys), so equal
    schemas share one compiled grammar and the wire carries a string."""
    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None       # a list is accepted; stored as a tuple
    grammar: str | None = None
    json_object: bool = False
    disable_any_whitespace: bool = False        # JSON: no whitespace between tokens
    disable_additional_properties: bool = False  # JSON: objects without additionalProperties
    #                                             in the schema take none

    def __post_init__(self):
        for name in ("json_object", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"structured_outputs.{name} must be a boolean")
        if self.json is not None:
            force_setattr(self, "json", _schema_text(self.json))
        if self.choice is not None:
            force_setattr(self, "choice", _choices(self.choice))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"structured_outputs.{name} must be a non-empty string")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, "
                f"json_object; got {', '.join(given) if given else 'none'}")
        if len(self.spec.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
            raise InvalidRequestError(f"structured_outputs.{self.kind} is larger than "
                                      f"{MAX_GRAMMAR_BYTES} bytes")
        _check_utf8(self.spec, self.kind)

    @property
    def kind(self) -> str:
        """Which constraint: one of KINDS."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint's text (choices as a JSON list; json_object: "")."""
        kind = self.kind
        if kind == "choice":
            return json.dumps(list(self.choice))
        return "" if kind == "json_object" else getattr(self, kind)

    @property
    def key(self) -> tuple:
        """What a compiled grammar depends on (the compile cache's key)."""
        return (self.kind, self.spec, self.disable_any_whitespace,
                self.disable_additional_properties)


def _schema_text(schema) -> str:
    if isinstance(schema, dict):
        try:
            return json.dumps(schema, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"structured_outputs.json is not a JSON schema: "
                                      f"{exc}") from None
    if not isinstance(schema, str):
        raise InvalidRequestError("structured_outputs.json must be a JSON schema (an object "
                                  "or its text)")
    try:
        value = json.loads(schema)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"structured_outputs.json is not valid JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise InvalidRequestError("structured_outputs.json must be a JSON schema: an object "
                                  f"(or true/false), got {type(value).__name__}")
    return schema


def _choices(choice) -> tuple[str, ...]:
    if isinstance(choice, (str, bytes, dict)) or not hasattr(choice, "__iter__"):
        raise InvalidRequestError("structured_outputs.choice must be a list of strings")
    choice = tuple(choice)
    if not choice or len(choice) > MAX_CHOICES or \
            any(not isinstance(c, str) or not c for c in choice):
        raise InvalidRequestError(f"structured_outputs.choice must be 1 to {MAX_CHOICES} "
                                  "non-empty strings")
    return choice


def _check_utf8(text: str, kind: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"structured_outputs.{kind} is not valid Unicode (lone "
                                  f"surrogate at position {exc.start})") from None

"""Structured outputs: what a request asks its tokens to obey (vLLM's StructuredOutputsParams).

Exactly one constraint per request: `json` (a JSON schema, a dict or its text), `regex`,
`choice` (one of these strings), `grammar` (Lark, or GBNF/EBNF as llama.cpp writes it),
`json_object` (any JSON object, OpenAI's response_format json_object) or `structural_tag`
(vLLM's: JSON text of free text with schema-constrained tags; STRUCTURAL_TAG). The engine core
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
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
JSON_KINDS = ("json", "json_object", "structural_tag")   # what JSON switches apply to
# structural_tag's two forms, as vLLM's response_format {"type": "structural_tag", ...}:
# {"structures": [{"begin", "schema", "end"}], "triggers": [...]} (both backends) or
# {"format": {...}} (xgrammar's structural tag format; the xgrammar backend only)
STRUCTURAL_TAG = "structural_tag"


class StructuredOutputsParams(msgspec.Struct, frozen=True, omit_defaults=True,
                              forbid_unknown_fields=True):
    """vLLM's field names. A `json` dict is kept as its JSON text (sorted keys), so equal
    schemas share one compiled grammar and the wire carries a string."""
    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None       # a list is accepted; stored as a tuple
    grammar: str | None = None
    json_object: bool | None = False            # None: not asked (vLLM's default), as False
    disable_any_whitespace: bool = False        # JSON: no whitespace between tokens
    disable_additional_properties: bool = False  # JSON: objects listing properties take
    #                                             no others unless the schema says so
    whitespace_pattern: str | None = None       # JSON: the regex of whitespace between
    #                                             tokens (the guidance backend only)
    structural_tag: str | None = None           # JSON text (STRUCTURAL_TAG)

    def __post_init__(self):
        if self.json_object is None:
            force_setattr(self, "json_object", False)
        for name in ("json_object", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"structured_outputs.{name} must be a boolean")
        if self.json is not None:
            force_setattr(self, "json", _schema_text(self.json))
        if self.choice is not None:
            force_setattr(self, "choice", _choices(self.choice))
        for name in ("regex", "grammar", "whitespace_pattern", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"structured_outputs.{name} must be a non-empty string")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, "
                f"json_object, structural_tag; got {', '.join(given) if given else 'none'}")
        size = len((self.spec + (self.whitespace_pattern or "")).encode("utf-8", "surrogatepass"))
        if size > MAX_GRAMMAR_BYTES:
            raise InvalidRequestError(f"structured_outputs.{self.kind} is larger than "
                                      f"{MAX_GRAMMAR_BYTES} bytes")
        _check_utf8(self.spec, self.kind)
        if self.regex is not None and "\x00" in self.regex:
            # vLLM refuses it too: never meaningful in a pattern, and the libraries
            # would let the model write a NUL byte into the text
            raise InvalidRequestError("structured_outputs.regex must not contain a NUL "
                                      "character ('\\x00')")
        if self.whitespace_pattern is not None:
            _check_whitespace_pattern(self)
        if self.structural_tag is not None:
            check_structural_tag(structural_tag(self))

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
                self.disable_additional_properties, self.whitespace_pattern)


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


def _check_whitespace_pattern(p: StructuredOutputsParams) -> None:
    """whitespace_pattern shapes JSON only, and says what disable_any_whitespace denies."""
    _check_utf8(p.whitespace_pattern, "whitespace_pattern")
    if p.kind not in JSON_KINDS:
        raise InvalidRequestError(f"structured_outputs.whitespace_pattern applies to "
                                  f"{', '.join(JSON_KINDS)}, not {p.kind}")
    if p.disable_any_whitespace:
        raise InvalidRequestError("structured_outputs.whitespace_pattern and "
                                  "disable_any_whitespace contradict; send one")


def structural_tag(p: StructuredOutputsParams) -> dict:
    """The structural tag's object (its text is checked to be one at construction)."""
    try:
        value = json.loads(p.structural_tag)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"structured_outputs.structural_tag is not valid JSON: "
                                  f"{exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError("structured_outputs.structural_tag must be the JSON text "
                                  "of an object")
    return value


def check_structural_tag(tag: dict) -> None:
    """The shape of a structural tag's either form (STRUCTURAL_TAG); what the grammar
    library makes of it is its own check (engine/grammars.py)."""
    name = "structured_outputs.structural_tag"
    if tag.get("type", STRUCTURAL_TAG) != STRUCTURAL_TAG:
        raise InvalidRequestError(f"{name} type must be {STRUCTURAL_TAG!r}")
    if "structures" not in tag:
        if not isinstance(tag.get("format"), dict):
            raise InvalidRequestError(f"{name} needs `structures` and `triggers`, or a "
                                      "`format` object")
        return
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(triggers, list) or not triggers or \
            any(not isinstance(t, str) or not t for t in triggers):
        raise InvalidRequestError(f"{name} triggers must be a list of non-empty strings")
    if not isinstance(structures, list) or not structures:
        raise InvalidRequestError(f"{name} structures must be a non-empty list")
    for s in structures:
        if not isinstance(s, dict) or not isinstance(s.get("begin"), str) \
                or not isinstance(s.get("end"), str) or not isinstance(s.get("schema"), dict):
            raise InvalidRequestError(f"{name} structures must be objects with a string "
                                      "`begin`, a `schema` object and a string `end`")
        if not any(s["begin"].startswith(t) for t in triggers):
            raise InvalidRequestError(f"{name}: begin {s['begin'][:60]!r} starts with none "
                                      f"of the triggers")


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

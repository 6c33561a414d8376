"""Structured outputs over HTTP: OpenAI's `response_format` and vLLM's `structured_outputs`
-> the engine's StructuredOutputsParams, and the engine's grammar errors -> a 400 naming
the field the constraint came from (docs/STRUCTURED_OUTPUTS.md).

response_format: {"type": "text"} (no constraint), {"type": "json_object"},
{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}, or
vLLM's {"type": "structural_tag", "structures", "triggers"} / {"type": "structural_tag",
"format"} (its JSON text becomes structured_outputs.structural_tag); on both endpoints,
as vLLM. structured_outputs (vLLM's extra): {"json" | "regex" | "choice" | "grammar" |
"json_object" | "structural_tag", "disable_any_whitespace",
"disable_additional_properties", "whitespace_pattern"};
vLLM's older guided_json / guided_regex / guided_choice / guided_grammar mean the same.
All are kept raw by the request models and decoded here once their size is known.

A grammar compiles in the engine (off its step loop); a failure there ends the request
with an error whose text starts with GRAMMAR_ERROR. The routes turn it into a 400 with
`param` = the field: a non-streamed request at its end, a streamed one before its
response starts (the SSE response begins with the first token of a constrained request,
so its status can still be 400: `first_batch`).

The front checks a constraint at submit (engine/grammars.py `check_grammar`: the library
parses it). A schema of real size takes that tens to hundreds of ms, and xgrammar's first
use imports it (seconds): such a check runs on a worker thread before the submit
(`check_on_loop`), whose own check then finds it in the front's cache; the event loop
and every other client's stream go on meanwhile.
"""
from __future__ import annotations

import json
import sys

import msgspec

from engine.structured_outputs import GRAMMAR_ERROR, MAX_GRAMMAR_BYTES, StructuredOutputsParams
from engine.config import InvalidRequestError
from engine.grammars import check_grammar, parsed_at_submit
from roseplay.serve.body import raw_value
from roseplay.serve.errors import OpenAIError, invalid

MAX_FIELD_BYTES = 2 * MAX_GRAMMAR_BYTES   # a raw response_format / structured_outputs / tools
# a constraint's text up to this many characters is checked at submit on the event loop
# (its library reads it in about a millisecond); a longer one on a worker thread
ON_LOOP_SPEC_CHARS = 1024


def decode_small(raw, param: str):
    """A raw field's JSON value (None when absent or null), refused past MAX_FIELD_BYTES
    before anything is built."""
    data = raw_value(raw)
    if data is None:
        return None
    if len(data) > MAX_FIELD_BYTES:
        raise invalid(f"{param} is larger than {MAX_FIELD_BYTES} bytes", param)
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"{param} is not valid JSON: {exc}", param) from None


def from_response_format(fmt, param: str = "response_format") -> StructuredOutputsParams | None:
    """OpenAI's response_format (decoded) -> the constraint (None for text); a 400 names
    `param`, the request field it came from."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return params(json_object=True, param=param)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise invalid(f"{param} json_schema needs json_schema.schema (a JSON "
                          "schema object)", param)
        return params(json=schema if isinstance(schema, dict) else str(schema).lower(),
                      param=param)
    if kind == "structural_tag":
        return params(structural_tag=json.dumps(fmt), param=param)
    raise invalid(f"{param} type must be text, json_object, json_schema or structural_tag, "
                  f"got {str(kind)[:40]!r}", param)


def from_structured_outputs(value) -> StructuredOutputsParams | None:
    """vLLM's structured_outputs object -> the constraint. Its `disable_fallback` (no
    other backend on a grammar error) is what the engine always does: it has no
    fallback per request, so the field is read and dropped."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("structured_outputs must be an object", "structured_outputs")
    if value.get("disable_fallback") not in (None, True, False):
        raise invalid("structured_outputs.disable_fallback must be a boolean",
                      "structured_outputs")
    fields = {k: v for k, v in value.items() if k != "disable_fallback"}
    return params(param="structured_outputs", **fields)


GUIDED = ("json", "regex", "choice", "grammar")     # vLLM's guided_* request fields


def from_guided(raws: dict, whitespace_pattern: str | None = None) -> tuple:
    """vLLM's guided_json / guided_regex / guided_choice / guided_grammar (its fields
    before structured_outputs; raw) -> (the constraint, the field it came from), or
    (None, None) when none is given. `whitespace_pattern`: its guided_whitespace_pattern,
    the constraint's whitespace_pattern (a 400 naming it without one)."""
    given = {kind: value for kind, raw in raws.items()
             if (value := decode_small(raw, "guided_" + kind)) is not None}
    if not given:
        if whitespace_pattern is not None:
            raise invalid("guided_whitespace_pattern shapes a guided_json's whitespace: "
                          "send one with it", "guided_whitespace_pattern")
        return None, None
    field = "guided_" + next(iter(given))
    if len(given) > 1:
        raise invalid(f"{' and '.join('guided_' + k for k in given)} both constrain the "
                      "output; send one", field)
    if whitespace_pattern is not None:
        given["whitespace_pattern"] = whitespace_pattern
    return params(param=field, **given), field


def params(param: str, **fields) -> StructuredOutputsParams:
    """StructuredOutputsParams, or a 400 naming the request field it came from."""
    try:
        return msgspec.convert(fields, StructuredOutputsParams)
    except (msgspec.ValidationError, InvalidRequestError) as exc:
        raise invalid(f"{param}: {exc}", param) from None


def refused_at_submit(exc: InvalidRequestError, field: str | None) -> InvalidRequestError:
    """A constraint the engine's front refused at submit (its grammar library cannot read
    it: engine/grammars.py): the 400 names the request field it came from, as a compile
    failure's does."""
    if field and str(exc).startswith(GRAMMAR_ERROR) and not getattr(exc, "param", None):
        exc.param = field
    return exc


def check_on_loop(p: StructuredOutputsParams | None, backend: str | None) -> bool:
    """Whether the front's check of constraint `p` at submit is cheap enough for the
    event loop: nothing to parse (engine/grammars.py parsed_at_submit), or a short spec
    whose library (engine/grammars.py: xgrammar's, else llguidance) is imported already.
    backend None: no front in this process checks it."""
    if not parsed_at_submit(p) or backend is None:
        return True
    library = "xgrammar" if backend == "xgrammar" else "llguidance"
    return library in sys.modules and len(p.spec) <= ON_LOOP_SPEC_CHARS


def check_constraint(p: StructuredOutputsParams | None, backend: str | None,
                     field: str | None) -> None:
    """The front's check at submit, ahead of it (a worker thread calls this): a refusal
    is the 400 naming `field`; a pass is remembered by the front, whose submit then
    does not parse the spec again."""
    if p is None or backend is None:
        return
    try:
        check_grammar(p, backend)
    except InvalidRequestError as exc:
        raise refused_at_submit(exc, field) from None


def grammar_error(choices, field: str | None) -> OpenAIError | None:
    """The 400 of a request whose grammar the engine refused (None: no such error)."""
    for c in choices:
        if field and c.finish_reason == "error" and (c.error or "").startswith(GRAMMAR_ERROR):
            return OpenAIError(400, c.error, param=field)
    return None


async def first_batch(stream, field: str):
    """A streamed constrained request: wait for its first batch of events before the
    response starts, so that a grammar the engine refused is a 400 (the stream is
    closed), not an error event in a 200. Returns the stream with that batch put back."""
    batches = stream.batches()
    try:
        first = await batches.__anext__()
    except StopAsyncIteration:
        first = []
    err = grammar_error([c for c, _ in first], field)
    if err is not None:
        stream.close()
        raise err
    return Primed(stream, first, batches)


class Primed:
    """A stream whose first batch was read already (first_batch): batches() yields it,
    then the rest; everything else is the stream's."""

    def __init__(self, stream, first: list, rest):
        self._stream, self._first, self._rest = stream, first, rest

    def __getattr__(self, name):
        return getattr(self._stream, name)

    async def batches(self):
        if self._first:
            yield self._first
        async for batch in self._rest:
            yield batch

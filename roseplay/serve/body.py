"""Request bodies -> the request models (roseplay/serve/protocol.py), or a 400 naming
the field (`param`).

Bodies are decoded by msgspec from the raw bytes in one typed pass: ~15x cheaper than
json.loads + pydantic for a 512-id prompt, which every request pays before its first
token (docs/SERVE.md "Admission"). The decode runs on the event loop and holds the GIL
(a worker thread would not free the loop), so its cost must stay small for any body
under the size limit: msgspec checks a collection's `max_length` only after it has
built every element, so a field that would be costly to build and is refused when large
(logit_bias: 300,000 keys took ~0.5 s) is declared `Raw` (its bytes are only checked
for JSON syntax, ~40x faster) and decoded here once its size is known
(`parse_logit_bias`).

`json_body` reads a request's: its Content-Type must be application/json, as vLLM's.
Failures: a type or range error is msgspec's message with the field (`param`); bytes
that are not UTF-8, not JSON, or nested past msgspec's recursion limit, a 400 without
one; JSON's lone-surrogate escapes ("\\ud800"), which msgspec refuses as malformed,
are found by the json module and named by field (no tokenizer, stop matcher or wire
codec can encode them).
"""
from __future__ import annotations

import json
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from engine.config import InvalidRequestError
from engine.validation import MAX_LOGIT_BIAS_ENTRIES
from roseplay.serve.errors import invalid

_AT = re.compile(r"^(.*?)(?: - at `\$\.?([^`]*)`)?$", re.S)
_MISSING = re.compile(r"missing required field `(\w+)`")
# OpenAI's and vLLM's logit_bias keys are token ids written as JSON object keys; only the
# canonical decimal form is one (int() would also take " 5 ", "+5", "5_0", "٥", "05");
# up to 20 digits: a larger id is refused by the range check, not by int()'s digit limit
_TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,19}")
_LOGIT_BIAS = msgspec.json.Decoder(dict[str, float])


def raw_field(schema: dict):
    """A field kept as its raw JSON (msgspec.Raw, UNSET when absent) whose OpenAPI schema
    is `schema` (or null)."""
    return Annotated[msgspec.Raw, Meta(extra_json_schema={"anyOf": [schema, {"type": "null"}]})] \
        | msgspec.UnsetType


def raw_value(raw) -> bytes | None:
    """A raw field's bytes; None when absent or null."""
    if raw is msgspec.UNSET:
        return None
    data = bytes(raw).strip()
    return None if data == b"null" else data


async def json_body(request, model: type):
    """The request model from a JSON request (parse_body). A Content-Type other than
    application/json (its parameters, such as charset, aside), or none, is a 400, as
    vLLM's validate_json_request answers it on its JSON endpoints (a 400, not a 415):
    a text/plain or form body was read as JSON."""
    body = await request.body()
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        sent = f"Content-Type {media!r:.80}" if media else "no Content-Type"
        raise invalid(f"Unsupported Media Type: Only 'application/json' is allowed (the "
                      f"request has {sent})", None)
    return parse_body(model, body)


def parse_body(model: type, body: bytes):
    """The request model from the raw body, or a 400 naming the field (`param`)."""
    try:
        return msgspec.json.decode(body, type=model)
    except msgspec.ValidationError as exc:
        raise field_error(exc) from None
    except UnicodeDecodeError as exc:    # msgspec < 0.23's error for bytes not UTF-8
        raise _not_utf8(exc) from None
    except RecursionError:               # msgspec's, for arrays/objects nested too deep
        raise invalid("the request body is nested too deeply", None) from None
    except msgspec.DecodeError:
        pass
    return _surrogates(model, body)


def _not_utf8(exc: UnicodeDecodeError) -> InvalidRequestError:
    return invalid(f"the request body is not valid UTF-8 (byte {exc.start}); JSON text "
                   "is UTF-8", None)


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _surrogates(model: type, body: bytes):
    """msgspec found the body malformed: read it with the json module (which takes
    lone-surrogate escapes), name the field that holds one, and decode the known
    fields again (a lone surrogate in a field the model ignores is ignored too)."""
    try:
        obj = json.loads(body, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:    # msgspec >= 0.23 raises DecodeError for these
        raise _not_utf8(exc) from None
    except (ValueError, RecursionError) as exc:
        where = f" at character {exc.pos}" if getattr(exc, "pos", None) is not None else ""
        raise invalid(f"JSON decode error{where}: {getattr(exc, 'msg', exc)}", None) from None
    if not isinstance(obj, dict):
        raise invalid(f"the request body must be a JSON object, got {type(obj).__name__}",
                      None)
    known = {name: obj[name] for name in model.__struct_fields__ if name in obj}
    for name, value in known.items():
        _check_utf8(value, name)
    try:
        return msgspec.json.decode(json.dumps(known).encode(), type=model)
    except msgspec.ValidationError as exc:
        raise field_error(exc) from None
    except msgspec.DecodeError as exc:       # e.g. a number json reads as inf
        raise invalid(f"JSON decode error: {exc}", None) from None


def _check_utf8(value, param: str) -> None:
    """Refuse lone surrogates (JSON's "\\ud800" escapes decode to them)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{param} is not valid Unicode (a lone surrogate)", param) from None
    elif isinstance(value, list):
        for item in value:
            _check_utf8(item, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_utf8(key, param)
            _check_utf8(item, param)


def field_error(exc: msgspec.ValidationError) -> InvalidRequestError:
    """msgspec's "Expected `int`, got `bool` - at `$.max_tokens`" -> "max_tokens:
    Expected `int`, got `bool`" with param "max_tokens" (the top-level field)."""
    message, path = _AT.match(str(exc)).groups()
    if path:
        return invalid(f"{path}: {message}", re.match(r"\w*", path).group() or None)
    missing = _MISSING.search(message)
    return invalid(message, missing.group(1) if missing else None)


def parse_logit_bias(raw) -> dict[int, float] | None:
    """OpenAI's logit_bias (token ids as JSON object keys) -> {int: float}, None when
    absent, null or empty. The entry count is read from the raw bytes before anything
    is built: in an object of canonical-id keys and number values every ':' separates
    one entry, so more than MAX_LOGIT_BIAS_ENTRIES of them is refused at once, and after
    decoding, fewer entries than separators means a key was given twice (JSON decoders
    keep the last value silently; the request is refused instead)."""
    data = raw_value(raw)
    if data is None:
        return None
    separators = data.count(b":")
    if separators > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid(f"logit_bias: at most {MAX_LOGIT_BIAS_ENTRIES} entries", "logit_bias")
    try:
        bias = _LOGIT_BIAS.decode(data)
    except msgspec.ValidationError as exc:
        raise invalid(f"logit_bias must be an object of token id -> bias (a number): "
                      f"{_AT.match(str(exc)).group(1)}", "logit_bias") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"logit_bias is not valid JSON: {exc}", "logit_bias") from None
    out = {}
    for key, value in bias.items():
        if not _TOKEN_ID.fullmatch(key):
            raise invalid(f"logit_bias keys must be token ids in decimal (ASCII digits, no "
                          f"sign, spaces or leading zeros), got {key[:40]!r}", "logit_bias")
        out[int(key)] = value
    if len(out) != separators:
        raise invalid("logit_bias has a token id more than once", "logit_bias")
    return out or None

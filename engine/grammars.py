"""A request's constraint as its grammar library's grammar, read without a tokenizer: what
the engine core compiles (engine/core/structured/) and what the front checks before a
request reaches the engine (vLLM's input processor checks the same way).

`check_grammar(params, backend)` parses the constraint with the configured library
(`auto` and `guidance`: llguidance; `xgrammar`) and raises InvalidRequestError naming the
field when the library refuses it: a regex that does not parse, a schema of an unknown
type, a grammar naming an undefined rule. It does not compile: no vocabulary, no masks,
no engine counter moves, so the core's compile (and its grammar cache) stays the one
place a grammar is built against the model's tokens. What only a compile can tell (a
grammar that admits nothing, over the library's limits, past compile_timeout) still ends
the request in the engine with a GRAMMAR_ERROR. A check's answer is kept per spec
(CHECKED_SPECS, by digest), so repeated schemas are parsed once in a front.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from typing import NamedTuple

from engine.config import InvalidRequestError
from engine.structured_outputs import (GRAMMAR_ERROR, STRUCTURAL_TAG, StructuredOutputsParams,
                                       structural_tag)

CHECKED_SPECS = 256      # specs whose check a front remembers (least recently used out)
COMPACT = (", ", ": ")   # compact JSON: json.dumps' separators (both backends)
_WHERE = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")   # xgrammar's "[20:11:21] /x/y.cc:83: "
NEEDS_TOKENIZER = "requires tokenizer_info"   # xgrammar's word for a Lark special token
_ECHO = re.compile(r"^(\^+|\d+ \|( .*)?)$")     # llguidance's caret and source lines


# JSON Schema keywords whose values are schemas (or lists of them), and those whose
# values map names to schemas; everything else (const, enum, default, examples, ...) is
# data, never rewritten
_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "propertyNames", "items",
               "prefixItems", "additionalItems", "unevaluatedItems", "contains", "not", "if",
               "then", "else", "allOf", "anyOf", "oneOf", "contentSchema")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas", "dependencies")


def closed_objects(schema):
    """A copy of `schema` in which an object schema that lists properties (or
    patternProperties) and says nothing of additionalProperties or unevaluatedProperties
    takes no others, and a tuple (prefixItems) no items past its listed ones: vLLM's
    disable_additional_properties, and what xgrammar's strict mode (vLLM's default)
    does. An object without listed properties stays open, as there."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed_objects(out[key])
    if "additionalProperties" not in out and "unevaluatedProperties" not in out and (
            isinstance(out.get("properties"), dict)
            or isinstance(out.get("patternProperties"), dict)):
        out["additionalProperties"] = False
    if "unevaluatedItems" not in out:       # a tuple takes no items past the listed ones
        if isinstance(out.get("prefixItems"), list) and "items" not in out:
            out["items"] = False
        elif isinstance(out.get("items"), list) and "additionalItems" not in out:
            out["additionalItems"] = False          # (draft 4's tuple form)
    return out


class JsonStyle(NamedTuple):
    """How a JSON constraint is written: the request's switches over the engine's
    (StructuredOutputsConfig's disable_any_whitespace and disable_additional_properties;
    a request's own whitespace_pattern wins over the engine's compact default)."""
    compact: bool = False            # no whitespace but COMPACT's (else any, vLLM's)
    closed: bool = False             # closed_objects
    whitespace: str | None = None    # the regex of whitespace between tokens (guidance)

    @classmethod
    def of(cls, p: StructuredOutputsParams, config=None) -> "JsonStyle":
        compact = p.disable_any_whitespace or bool(getattr(config, "disable_any_whitespace",
                                                           False))
        closed = p.disable_additional_properties or bool(
            getattr(config, "disable_additional_properties", False))
        return cls(compact and p.whitespace_pattern is None, closed, p.whitespace_pattern)


def reason(exc: Exception | str) -> str:
    """A library's error as one bounded line of text: xgrammar's C++ source path cut,
    llguidance's source echo and caret lines ("   1 | start: /(/", "      ^") dropped
    (an error bar, a log line and a JSON message show one line)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines()]
    kept = [ln for ln in lines if ln and not _ECHO.match(ln) and ln != "<non-verbose/>"]
    return _WHERE.sub("", " ".join(kept) or text)[:500]


def _schema(p: StructuredOutputsParams, style: JsonStyle, schema=None):
    """The JSON schema of a json / json_object constraint, or `schema` (a structural
    tag's): a dict, or text as given; the schema `true`, any JSON value, as `{}`
    (llguidance takes only objects)."""
    if p.kind == "json_object":
        return {"type": "object"}
    text = p.json if schema is None else None
    if text is not None and text.strip() == "true":
        return {}
    if not style.closed:
        return schema if text is None else text
    return closed_objects(json.loads(text) if text is not None else schema)


def _guidance_options(style: JsonStyle) -> dict:
    """llguidance's JSON options of a style."""
    if style.whitespace is not None:
        return {"whitespace_flexible": True, "whitespace_pattern": style.whitespace}
    if style.compact:
        return {"whitespace_flexible": False, "item_separator": COMPACT[0],
                "key_separator": COMPACT[1]}
    return {"whitespace_flexible": True}


def guidance_grammar(p: StructuredOutputsParams, style: JsonStyle = JsonStyle()) -> str:
    """llguidance's grammar (text) of a constraint. Raises what the library raises on a
    spec it cannot read (ValueError, TypeError, RecursionError)."""
    import llguidance
    kind = p.kind
    if kind in ("json", "json_object"):
        return llguidance.LLMatcher.grammar_from_json_schema(
            _schema(p, style), defaults=_guidance_options(style))
    if kind == "choice":
        return llguidance.grammar_from("choice", list(p.choice))
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(p.regex)
    if kind == STRUCTURAL_TAG:
        return _guidance_structural_tag(p, style)
    return llguidance.grammar_from("grammar", p.grammar)


def _guidance_structural_tag(p: StructuredOutputsParams, style: JsonStyle) -> str:
    """llguidance's StructTag grammar: free text, each trigger opening its tag, whose
    body obeys the tag's schema (its options in the schema's `x-guidance`, which the
    library's `%json` reads) and ends with `end`. The first trigger a begin starts with is
    its trigger. Only the `structures` form: `format` is xgrammar's."""
    import llguidance
    tag = structural_tag(p)
    if "structures" not in tag:
        raise ValueError("the `format` form of structural_tag (xgrammar's structural tag "
                         "format) needs the xgrammar backend; the guidance backend reads "
                         "the `structures` and `triggers` form")
    tags = []
    for s in tag["structures"]:
        schema = dict(_schema(p, style, s["schema"]))
        schema["x-guidance"] = _guidance_options(style)
        trigger = next(t for t in tag["triggers"] if s["begin"].startswith(t))
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=schema,
                                         end=s["end"]))
    return llguidance.StructTag.to_grammar(tags)


def xgrammar_grammar(p: StructuredOutputsParams, style: JsonStyle = JsonStyle(),
                     tokenizer_info=None):
    """xgrammar's Grammar of a constraint (parsed, not compiled). A `grammar` with `::=`
    is GBNF / EBNF as llama.cpp writes it, else Lark, whose named special tokens
    (`<|endoftext|>`) need the engine's `tokenizer_info`. A closed style is xgrammar's
    strict mode (its objects and arrays take nothing the schema does not list); an open
    one follows JSON Schema (unlisted properties allowed). Raises RuntimeError (or
    ValueError, TypeError) on a spec the library refuses."""
    import xgrammar as xgr        # here: its import loads transformers (seconds)
    kind = p.kind
    if style.whitespace is not None:
        raise ValueError(WHITESPACE_PATTERN_XGRAMMAR)
    if kind in ("json", "json_object"):
        schema = _schema(p, style)
        return xgr.Grammar.from_json_schema(
            schema if isinstance(schema, str) else json.dumps(schema),
            any_whitespace=not style.compact, separators=COMPACT if style.compact else None,
            strict_mode=style.closed)
    if kind == "regex":
        return xgr.Grammar.from_regex(p.regex)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(s, ensure_ascii=False) for s in p.choice)
        return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
    if kind == STRUCTURAL_TAG:
        tag = structural_tag(p)
        if "structures" not in tag:
            return xgr.Grammar.from_structural_tag(p.structural_tag)
        items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]),
                                       end=s["end"]) for s in tag["structures"]]
        return xgr.Grammar.from_structural_tag(items, tag["triggers"])
    if "::=" in p.grammar:
        return xgr.Grammar.from_ebnf(p.grammar)
    return xgr.Grammar.from_lark(p.grammar, tokenizer_info=tokenizer_info)


WHITESPACE_PATTERN_XGRAMMAR = ("whitespace_pattern is not supported by the xgrammar "
                               "backend (llguidance's guidance backend reads it)")


def _refusal(p: StructuredOutputsParams, backend: str) -> str:
    """The library's reason for refusing the constraint ("" when it reads it)."""
    style = JsonStyle.of(p)
    try:
        if backend == "xgrammar":
            try:
                xgrammar_grammar(p, style)
            except RuntimeError as exc:   # a named special token: the engine, which has
                if NEEDS_TOKENIZER not in str(exc):   # the tokenizer, decides
                    raise
            return ""
        import llguidance
        error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            guidance_grammar(p, style))
        return (reason("; ".join(messages)) if messages else "refused") if error else ""
    except (RuntimeError, ValueError, TypeError, RecursionError, AssertionError) as exc:
        return reason(exc)


_checked: OrderedDict[bytes, str] = OrderedDict()
_lock = threading.Lock()


def parsed_at_submit(p: StructuredOutputsParams | None) -> bool:
    """Whether check_grammar reads the constraint: json_object is `{"type": "object"}`,
    nothing to parse, unless a whitespace_pattern comes with it."""
    return p is not None and (p.kind != "json_object" or p.whitespace_pattern is not None)


def check_grammar(p: StructuredOutputsParams | None, backend: str) -> None:
    """Raises InvalidRequestError (its text starts with GRAMMAR_ERROR and names the
    field, as the engine's) when `backend`'s library cannot read the constraint."""
    if not parsed_at_submit(p):
        return
    digest = hashlib.blake2b(repr((backend, p.key)).encode("utf-8", "surrogatepass"),
                             digest_size=16).digest()
    with _lock:
        refusal = _checked.get(digest)
        if refusal is not None:
            _checked.move_to_end(digest)
    if refusal is None:
        refusal = _refusal(p, backend)
        with _lock:
            _checked[digest] = refusal
            while len(_checked) > CHECKED_SPECS:
                _checked.popitem(last=False)
    if refusal:
        raise InvalidRequestError(f"{GRAMMAR_ERROR}: structured_outputs.{p.kind} is "
                                  f"invalid: {refusal}")

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

from engine.config import InvalidRequestError
from engine.structured_outputs import GRAMMAR_ERROR, StructuredOutputsParams

CHECKED_SPECS = 256      # specs whose check a front remembers (least recently used out)
COMPACT = (", ", ": ")   # compact JSON: json.dumps' separators (both backends)
_WHERE = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")   # xgrammar's "[20:11:21] /x/y.cc:83: "
NEEDS_TOKENIZER = "requires tokenizer_info"   # xgrammar's word for a Lark special token
_ECHO = re.compile(r"^(\^+|\d+ \| .*)$")        # llguidance's caret and source lines


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


def reason(exc: Exception | str) -> str:
    """A library's error as one bounded line of text: xgrammar's C++ source path cut,
    llguidance's source echo and caret lines ("   1 | start: /(/", "      ^") dropped
    (an error bar, a log line and a JSON message show one line)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines()]
    kept = [ln for ln in lines if ln and not _ECHO.match(ln) and ln != "<non-verbose/>"]
    return _WHERE.sub("", " ".join(kept) or text)[:500]


def _schema(p: StructuredOutputsParams):
    """The JSON schema of a json / json_object constraint (a dict, or text as given;
    the schema `true`, any JSON value, as `{}`: llguidance takes only objects)."""
    if p.kind == "json_object":
        return {"type": "object"}
    if p.json.strip() == "true":
        return {}
    return no_additional_properties(json.loads(p.json)) \
        if p.disable_additional_properties else p.json


def guidance_grammar(p: StructuredOutputsParams, compact: bool) -> str:
    """llguidance's grammar (text) of a constraint; `compact`: JSON without whitespace
    but COMPACT's (else any between tokens, vLLM's default). Raises what the library
    raises on a spec it cannot read (ValueError, TypeError, RecursionError)."""
    import llguidance
    kind = p.kind
    if kind in ("json", "json_object"):
        options = {"whitespace_flexible": False, "item_separator": COMPACT[0],
                   "key_separator": COMPACT[1]} if compact else {"whitespace_flexible": True}
        return llguidance.LLMatcher.grammar_from_json_schema(_schema(p), defaults=options)
    if kind == "choice":
        return llguidance.grammar_from("choice", list(p.choice))
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(p.regex)
    return llguidance.grammar_from("grammar", p.grammar)


def xgrammar_grammar(p: StructuredOutputsParams, compact: bool, tokenizer_info=None):
    """xgrammar's Grammar of a constraint (parsed, not compiled). A `grammar` with `::=`
    is GBNF / EBNF as llama.cpp writes it, else Lark, whose named special tokens
    (`<|endoftext|>`) need the engine's `tokenizer_info`. Raises RuntimeError (or
    ValueError, TypeError) on a spec the library refuses."""
    import xgrammar as xgr        # here: its import loads transformers (seconds)
    kind = p.kind
    if kind in ("json", "json_object"):
        schema = _schema(p)
        return xgr.Grammar.from_json_schema(
            schema if isinstance(schema, str) else json.dumps(schema),
            any_whitespace=not compact, separators=COMPACT if compact else None)
    if kind == "regex":
        return xgr.Grammar.from_regex(p.regex)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(s, ensure_ascii=False) for s in p.choice)
        return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
    if "::=" in p.grammar:
        return xgr.Grammar.from_ebnf(p.grammar)
    return xgr.Grammar.from_lark(p.grammar, tokenizer_info=tokenizer_info)


def _refusal(p: StructuredOutputsParams, backend: str) -> str:
    """The library's reason for refusing the constraint ("" when it reads it)."""
    try:
        if backend == "xgrammar":
            try:
                xgrammar_grammar(p, compact=False)
            except RuntimeError as exc:   # a named special token: the engine, which has
                if NEEDS_TOKENIZER not in str(exc):   # the tokenizer, decides
                    raise
            return ""
        import llguidance
        error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            guidance_grammar(p, compact=False))
        return (reason("; ".join(messages)) if messages else "refused") if error else ""
    except (RuntimeError, ValueError, TypeError, RecursionError) as exc:
        return reason(exc)


_checked: OrderedDict[bytes, str] = OrderedDict()
_lock = threading.Lock()


def check_grammar(p: StructuredOutputsParams | None, backend: str) -> None:
    """Raises InvalidRequestError (its text starts with GRAMMAR_ERROR and names the
    field, as the engine's) when `backend`'s library cannot read the constraint."""
    if p is None or p.kind == "json_object":
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

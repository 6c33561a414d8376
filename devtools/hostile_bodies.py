"""Hostile HTTP bodies for /v1/completions and /v1/chat/completions: each must get a 4xx
JSON error in OpenAI's format (never a 500, never text/plain), and none may disturb the
requests beside it. Shared by tests/roseplay/serve/test_serve_adversarial.py and scripts/soak_http.py.

`hostile_bodies(seed, count)` gives the fixed hand-written cases first, then seeded
mutations of a good body (a field set to a value of the wrong type or out of range), so
a run is the same on every machine. LOOSE names the cases whose refusal needs the
engine-side validation layer (values the wire codec cannot carry): until it is in, they
are only required not to hurt the neighbours or leak.
"""
from __future__ import annotations

import json
import random

MODEL = "default"
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
GOOD = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
GOOD_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What news?"}],
             "max_tokens": 4}

# (name, endpoint, raw body bytes or a JSON-able dict)
FIXED = [
    ("not-json", "completions", b"{not json"),
    ("empty-body", "completions", b""),
    ("json-array", "completions", b"[1, 2, 3]"),
    ("json-null", "completions", b"null"),
    ("json-string", "chat/completions", b'"hello"'),
    ("nan-literal", "completions", b'{"model": "default", "prompt": "x", "temperature": NaN}'),
    ("deep-nesting", "completions", b'{"model": "default", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("model-empty", "completions", {**GOOD, "model": ""}),    # (no model: the served one)
    ("model-int", "completions", {**GOOD, "model": 7}),
    ("unknown-model", "completions", {**GOOD, "model": "gpt-9"}),
    ("prompt-bool", "completions", {**GOOD, "prompt": True}),
    ("prompt-bools", "completions", {**GOOD, "prompt": [True, False]}),
    ("prompt-dict", "completions", {**GOOD, "prompt": {}}),
    ("prompt-empty-lists", "completions", {**GOOD, "prompt": [[]]}),
    ("prompt-mixed", "completions", {**GOOD, "prompt": [[1, "a"]]}),
    ("prompt-negative-id", "completions", {**GOOD, "prompt": [-1]}),
    ("prompt-huge-id", "completions", {**GOOD, "prompt": [10 ** 12]}),
    ("prompt-too-long", "completions", {**GOOD, "prompt": [1] * 5000}),
    ("prompt-lone-surrogate", "completions", {**GOOD, "prompt": "ROMEO.\ud800\n"}),
    ("max-tokens-bool", "completions", {**GOOD, "max_tokens": True}),
    ("max-tokens-string", "completions", {**GOOD, "max_tokens": "5"}),
    ("max-tokens-zero", "completions", {**GOOD, "max_tokens": 0}),
    ("max-tokens-huge", "completions", {**GOOD, "max_tokens": 10 ** 30}),
    ("max-tokens-float", "completions", {**GOOD, "max_tokens": 1.5}),
    ("temperature-string", "completions", {**GOOD, "temperature": "hot"}),
    ("temperature-negative", "completions", {**GOOD, "temperature": -1}),
    ("top-p-two", "completions", {**GOOD, "top_p": 2}),
    ("top-k-negative", "completions", {**GOOD, "top_k": -5}),
    ("top-k-int64", "completions", {**GOOD, "temperature": 1, "top_k": 2 ** 63}),
    ("n-zero", "completions", {**GOOD, "n": 0}),
    ("n-many", "completions", {**GOOD, "n": 100000}),
    ("n-bool", "completions", {**GOOD, "n": True}),
    ("stop-empty", "completions", {**GOOD, "stop": [""]}),
    ("stop-int", "completions", {**GOOD, "stop": 5}),
    ("stop-surrogate", "completions", {**GOOD, "stop": ["\udc00"]}),
    ("stop-token-ids-negative", "completions", {**GOOD, "stop_token_ids": [-1]}),
    ("stop-token-ids-uint64", "completions", {**GOOD, "stop_token_ids": [2 ** 64]}),
    ("seed-huge", "completions", {**GOOD, "seed": 2 ** 70}),
    ("stream-string", "completions", {**GOOD, "stream": "yes"}),
    ("stream-options-no-stream", "completions", {**GOOD, "stream_options": {"include_usage": True}}),
    ("logit-bias-huge", "completions", {**GOOD, "logit_bias": {"1": 1e308}}),
    ("logit-bias-key", "completions", {**GOOD, "logit_bias": {"one": 5}}),
    ("logit-bias-uint64-id", "completions", {**GOOD, "logit_bias": {str(2 ** 64): 5}}),
    ("logprobs-huge", "completions", {**GOOD, "logprobs": 10 ** 6}),
    ("best-of-below-n", "completions", {**GOOD, "n": 3, "best_of": 2}),
    ("repetition-penalty-zero", "completions", {**GOOD, "repetition_penalty": 0}),
    ("priority-huge", "completions", {**GOOD, "priority": 2 ** 40}),
    ("messages-empty", "chat/completions", {**GOOD_CHAT, "messages": []}),
    ("messages-not-list", "chat/completions", {**GOOD_CHAT, "messages": "hi"}),
    ("message-empty", "chat/completions", {**GOOD_CHAT, "messages": [{}]}),
    ("message-role-robot", "chat/completions", {**GOOD_CHAT, "messages": [{"role": "robot", "content": "x"}]}),
    ("message-content-int", "chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": 5}]}),
    ("message-surrogate", "chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": "\ud83d"}]}),
    ("tools-no-function", "chat/completions", {**GOOD_CHAT, "tools": [{"type": "function"}]}),
    ("tools-bad-name", "chat/completions", {**GOOD_CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
    ("tool-choice-required", "chat/completions", {**GOOD_CHAT, "tool_choice": "required"}),
    ("tool-choice-named", "chat/completions", {**GOOD_CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ("tool-choice-unknown-tool", "chat/completions", {**GOOD_CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    ("response-format-xml", "chat/completions", {**GOOD_CHAT, "response_format": {"type": "xml"}}),
    # grammars the engine refuses (structured outputs, docs/STRUCTURED_OUTPUTS.md): a 400 naming
    # the field, streamed or not; the neighbours decode on
    ("schema-invalid", "chat/completions", {**GOOD_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
    ("schema-invalid-stream", "chat/completions", {**GOOD_CHAT, "stream": True, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
    ("schema-self-reference", "completions", {**GOOD, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}),
    ("schema-huge", "completions", {**GOOD, "structured_outputs": {"json": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}}}),
    ("regex-invalid", "completions", {**GOOD, "structured_outputs": {"regex": "(unclosed"}}),
    ("tool-schema-invalid", "chat/completions", {**GOOD_CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}], "tool_choice": "required"}),
    ("max-completion-tokens-bool", "chat/completions", {**GOOD_CHAT, "max_completion_tokens": False}),
    # bodies that are not UTF-8, nested past the decoder's limit, or a path with a slash
    ("invalid-utf8", "completions", b'{"model": "default", "prompt": "a\xff\xfeb", "max_tokens": 1}'),
    ("invalid-utf8-logit-bias", "completions", b'{"model": "default", "prompt": "x", "logit_bias": {"1": "\xff"}}'),
    ("deep-nesting-unknown-field", "completions", b'{"model": "default", "prompt": "x", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
    ("trailing-slash", "completions/", GOOD),
    # in range as Python floats, 0 or infinite in the sampler's float32
    ("top-p-underflow", "completions", {**GOOD, "top_p": 1e-300}),
    ("top-p-subnormal", "completions", {**GOOD, "top_p": 1e-46}),
    ("repetition-penalty-tiny", "completions", {**GOOD, "repetition_penalty": 1e-300}),
    ("repetition-penalty-1e-40", "completions", {**GOOD, "repetition_penalty": 1e-40}),
    # logit_bias keys: token ids in decimal only, each once, at most 1,024
    ("logit-bias-key-spaces", "completions", {**GOOD, "logit_bias": {" 5 ": 1}}),
    ("logit-bias-key-plus", "completions", {**GOOD, "logit_bias": {"+5": 1}}),
    ("logit-bias-key-underscore", "completions", {**GOOD, "logit_bias": {"5_0": 1}}),
    ("logit-bias-key-arabic-digit", "completions", {**GOOD, "logit_bias": {"\u0665": 1}}),
    ("logit-bias-key-leading-zero", "completions", {**GOOD, "logit_bias": {"5": 1, "05": 2}}),
    ("logit-bias-key-twice", "completions", b'{"model": "default", "prompt": "x", "logit_bias": {"5": 1, "5": 2}}'),
    ("logit-bias-300k", "completions", {**GOOD, "logit_bias": {str(i): 1 for i in range(300_000)}}),
    ("seed-plus-n-overflow", "completions", {**GOOD, "seed": 2 ** 64 - 1, "n": 2}),
    # lists past their bounds: refused at decode time
    ("messages-120k-empty", "chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": ""}] * 120_000}),
    ("stop-many", "completions", {**GOOD, "stop": ["a"] * 800_000}),
    ("response-format-300k", "chat/completions", {**GOOD_CHAT, "response_format": {str(i): 1 for i in range(300_000)}}),
]
LOOSE: set[str] = set()     # every hostile value is refused with a 400 (engine/validation.py)

FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids",
          "ignore_eos", "stream", "echo", "priority", "prompt", "model", "user", "logprobs"]
BAD_VALUES = [True, False, None, "5", "", -1, -(2 ** 31), 2 ** 63, 1e308, -1e308, [], {}, [None],
              [True], {"a": 1}, "\u0000", "x" * 300]


def encode(body) -> bytes:
    if isinstance(body, bytes):
        return body
    # surrogates pass through as JSON \\u escapes, as a hostile client would send them
    return json.dumps(body, ensure_ascii=True).encode()


def mutations(seed: int, count: int):
    """`count` seeded (name, endpoint, body): a good body with 1-2 fields set to bad values.
    Some of them are valid requests (e.g. ignore_eos: false): those must get a 200."""
    rng = random.Random(seed)
    for i in range(count):
        body = dict(GOOD)
        for _ in range(rng.randint(1, 2)):
            body[rng.choice(FIELDS)] = rng.choice(BAD_VALUES)
        yield f"mutation-{i}", "completions", body


def hostile_bodies(seed: int = 0, count: int = 40):
    """FIXED then `count` mutations: (name, endpoint, bytes)."""
    for name, endpoint, body in [*FIXED, *mutations(seed, count)]:
        yield name, endpoint, encode(body)


def check_refusal(name: str, status: int, content_type: str, body: bytes) -> str | None:
    """None if the answer is acceptable for hostile case `name`, else what is wrong.
    A 4xx with an OpenAI error body is always right; a mutation may also be a valid
    request (200); a LOOSE case may still fail with a 500 JSON error."""
    if 400 <= status < 500 or (status >= 500 and name in LOOSE):
        if not content_type.startswith("application/json"):
            return f"{name}: {status} with content-type {content_type!r}"
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{name}: {status} body is not an OpenAI error: {body[:200]!r}"
        if set(err) != {"message", "type", "param", "code"}:
            return f"{name}: error fields {sorted(err)}"
        return None
    if status == 200 and (name.startswith("mutation-") or name in LOOSE):
        return None
    return f"{name}: HTTP {status} {content_type} {body[:200]!r}"

"""Request ids, as vLLM's server makes them: the `X-Request-Id` header (else the body's
`request_id`) is the base of a response's id (`cmpl-BASE`, `chatcmpl-BASE`,
`resp_BASE`), and `--enable-request-id-headers` echoes the base in an `X-Request-Id`
response header (RequestIdMiddleware).

A client's base names the response, never the engine's requests: the engine refuses a
request id it already runs, and two clients may send the same header (a retry, a
constant in a script). Engine ids always end in this process's tag and a counter
(`chatcmpl-BASE-<tag><count>-<i>`), so no client's id can make one collide or fail;
the base in front (and the OpenAI `user` field) only label them in the TUI.
"""
from __future__ import annotations

import itertools
import re
import secrets
from dataclasses import dataclass

from roseplay.serve.errors import invalid

HEADER = "x-request-id"
_HEADER_BYTES = HEADER.encode()
MAX_CLIENT_ID_CHARS = 256      # a longer one would be copied into every streamed chunk
USER_LABEL_CHARS = 16          # the `user` field's share of an engine id
CLIENT_LABEL_CHARS = 64        # the client id's share of an engine id
_UNSAFE_USER = re.compile(r"[^A-Za-z0-9_.]")
_UNSAFE_CLIENT = re.compile(r"[^A-Za-z0-9_.:-]")
_HEADER_SAFE = re.compile(r"[\x20-\x7e]+")

# a random tag per process and a counter: unique across API-server processes, and a
# fraction of uuid4's cost per request
_ID_TAG, _ID_COUNT = secrets.token_hex(4), itertools.count()


def unique_tail() -> str:
    """This process's tag and the next count: no two calls of any API server alike."""
    return f"{_ID_TAG}{next(_ID_COUNT):08x}"


@dataclass(frozen=True)
class RequestIds:
    base: str        # what X-Request-Id names (the client's, or one made here)
    response: str    # the response's id: f"{prefix}-{base}"
    engine: str      # the engine requests' ids are f"{engine}-{i}": unique in this server


def client_id(request, body_id: str | None) -> str | None:
    """The client's base, as vLLM reads it: the X-Request-Id header, else the body's
    request_id; None (or empty) when neither is sent. A 400 past MAX_CLIENT_ID_CHARS."""
    header = request.headers.get(HEADER)
    chosen, where = (header, None) if header else (body_id, "request_id")
    if chosen and len(chosen) > MAX_CLIENT_ID_CHARS:
        name = "the X-Request-Id header" if where is None else "request_id"
        raise invalid(f"{name} must be at most {MAX_CLIENT_ID_CHARS} characters, got "
                      f"{len(chosen)}", where)
    return chosen or None


def _label(text: str | None, unsafe: re.Pattern, chars: int) -> str:
    return unsafe.sub("", text or "")[:chars]


def assign(prefix: str, user: str | None = None, client: str | None = None) -> RequestIds:
    """The ids of one generation request: the endpoint's prefix ("cmpl", "chatcmpl",
    "resp"), then the OpenAI `user` field when given (so a class's clients tell
    themselves apart in the TUI), then the client's id or, without one, hex."""
    tail = unique_tail()
    labels = [label for label in (_label(user, _UNSAFE_USER, USER_LABEL_CHARS),
                                  _label(client, _UNSAFE_CLIENT, CLIENT_LABEL_CHARS)) if label]
    engine = "-".join([prefix, *labels, tail])
    if client:
        return RequestIds(client, f"{prefix}-{client}", engine)
    base = engine.split("-", 1)[1]
    return RequestIds(base, engine, engine)


def note(request, ids: RequestIds) -> None:
    """Tell RequestIdMiddleware the base this request's response names (a body's
    request_id only when a header can carry it: visible ASCII and spaces)."""
    if _HEADER_SAFE.fullmatch(ids.base):
        request.scope.setdefault("state", {})["request_id"] = ids.base


class RequestIdMiddleware:
    """--enable-request-id-headers (vLLM's flag): every response carries X-Request-Id,
    the client's header as sent, else the base of the generation's id (`note`), else a
    new one; refusals of the layers inside (401, 413, 503) included."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = next((v for k, v in scope["headers"] if k.lower() == _HEADER_BYTES and v), None)

        async def with_id(message):
            if message["type"] == "http.response.start":
                value = sent or (scope.get("state", {}).get("request_id")
                                 or unique_tail()).encode("latin-1")
                message["headers"] = [*message.get("headers", ()), (_HEADER_BYTES, value)]
            await send(message)
        await self.app(scope, receive, with_id)

"""One plain ASGI middleware in front of the routes: drain (503), body limit (413), API
key (401), and unexpected exceptions (500), in that order, each in OpenAI's error format.

One layer rather than four: every layer is a coroutine call per request and, for the
500 watch, a wrapper on every send; under 256 requests at once that was a visible
share of the server's CPU per request (docs/SERVE.md "Admission"). It acts before
FastAPI reads or parses anything.
"""
from __future__ import annotations

import json
import logging
import secrets

from fastapi import HTTPException

from roseplay.serve.errors import REQUEST_TOO_LARGE, OpenAIError

KEYED_DEV_PATHS = frozenset({"/reset_prefix_cache", "/routing", "/tokenize", "/detokenize",
                             "/server_info", "/invocations"})
logger = logging.getLogger("roseplay.serve")


async def send_error(send, exc: OpenAIError, headers=()) -> None:
    body = json.dumps(exc.body()).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def bearer_token(header: bytes) -> bytes | None:
    """The token of `Authorization: Bearer TOKEN`; the scheme is case-insensitive
    (RFC 9110 section 11.1)."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


class GateMiddleware:
    """- drain: 503 to every request that arrives while the server drains for shutdown
      (one on a kept-alive connection: new connections are already refused);
    - max_bytes: bodies over it get 413, at once from Content-Length, or while a chunked
      body is read (the handler's body read raises HTTPException(413));
    - api_key: `Authorization: Bearer KEY` on /v1/* and the dev endpoints (as vLLM's
      --api-key); /health and /metrics stay open for probes and scrapers;
    - an unexpected exception before the response started becomes a 500 and the
      connection stays usable: were it re-raised, uvicorn would close the connection
      after the response, under a client that already reuses it (a ReadError)."""

    def __init__(self, app, drain, max_bytes: int, api_key: str | None = None):
        self.app, self.drain, self.max_bytes = app, drain, max_bytes
        self._expected = api_key.encode() if api_key else None

    def _too_large(self) -> str:
        return f"request body is larger than the server's limit of {self.max_bytes} bytes"

    def _refusal(self, scope) -> tuple[OpenAIError, list] | None:
        if self.drain.draining:
            return OpenAIError(503, "the server is shutting down",
                               code="server_shutting_down"), [(b"connection", b"close")]
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return OpenAIError(413, self._too_large(), code=REQUEST_TOO_LARGE), []
        path = scope["path"]
        if self._expected is not None and (path.startswith("/v1") or path in KEYED_DEV_PATHS):
            got = bearer_token(headers.get(b"authorization", b"")) or b""
            if not secrets.compare_digest(got, self._expected):
                return OpenAIError(401, "missing or invalid API key (send 'Authorization: "
                                        "Bearer KEY')", code="invalid_api_key"), []
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if (refusal := self._refusal(scope)) is not None:
            return await send_error(send, *refusal)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises an HTTPException from its body read as is
                    raise HTTPException(413, self._too_large())
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, counted, watched)
        except Exception as exc:
            if started:
                raise
            logger.exception("internal error")
            await send_error(send, OpenAIError(500, f"internal error: {type(exc).__name__}: "
                                                    f"{exc}"))

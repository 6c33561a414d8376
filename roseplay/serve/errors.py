"""OpenAI-format errors: {"error": {"message", "type", "param", "code"}} with the right status.

Every failure leaves the server in this shape: engine InvalidRequestError and pydantic
validation -> 400 (not FastAPI's 422), missing/wrong API key -> 401, unknown model ->
404, body over the limit -> 413, waiting queue over --max-waiting -> 429, engine stopped
-> 503. The API-key check and the body limit are plain ASGI middlewares, so they act
before FastAPI reads or parses anything.
"""
from __future__ import annotations

import functools
import json
import logging
import secrets

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.config import InvalidRequestError

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


_CODES = {413: "request_too_large", 404: "not_found", 405: "method_not_allowed"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        return error_body(self.status, self.message, self.code, self.param)


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def invalid(message: str, param: str) -> InvalidRequestError:
    """A 400 about request field `param` (param_of reads it back)."""
    exc = InvalidRequestError(message)
    exc.param = param
    return exc


def error_response(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


@functools.cache
def request_fields() -> frozenset[str]:
    from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest  # a cycle
    return frozenset(CompletionRequest.model_fields) | frozenset(ChatCompletionRequest.model_fields)


def param_of(exc: Exception) -> str | None:
    """The request field an engine/server 400 is about: its own `param`, else the field
    its message starts with ("temperature must be in ...", "prompt: ...")."""
    param = getattr(exc, "param", None)
    if param:
        return param
    first = str(exc).split(" ", 1)[0].rstrip(":,")
    return first if first in request_fields() else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's errors as one message; `param` is the first error's field (its loc
    without "body", union-branch names or list indices), None for a body that is not JSON."""
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            where = f" at character {loc[0]}" if loc else ""
            parts.append(f"JSON decode error{where}: {err.get('ctx', {}).get('error', '')}")
            continue
        field = next((x for x in loc if x in request_fields()), loc[0] if loc else None)
        param = param or field
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError):
        return error_response(exc)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError):
        return error_response(OpenAIError(400, str(exc), param=param_of(exc)))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(OpenAIError(400, message, param=param))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # still a bug (Starlette logs the traceback), but the client gets OpenAI's format
        return error_response(OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(OpenAIError(exc.status_code, str(exc.detail),
                                           code=_CODES.get(exc.status_code)))


async def _send_error(send, exc: OpenAIError, headers=()) -> None:
    body = json.dumps(exc.body()).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class InternalErrorMiddleware:
    """An unexpected exception before the response started becomes a 500 in OpenAI's
    format, and the connection stays usable: were it re-raised, uvicorn would close the
    connection after the response, under a client that already reuses it (a ReadError)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            logging.getLogger("roseplay.serve").exception("internal error")
            await _send_error(send, OpenAIError(500, f"internal error: {type(exc).__name__}: "
                                                     f"{exc}"))


class DrainMiddleware:
    """503 to every request that arrives while the server drains for shutdown (one on a
    kept-alive connection: new connections are already refused)."""

    def __init__(self, app, drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.drain.draining:
            return await _send_error(send, OpenAIError(
                503, "the server is shutting down", code="server_shutting_down"),
                [(b"connection", b"close")])
        await self.app(scope, receive, send)


def bearer_token(header: bytes) -> bytes | None:
    """The token of `Authorization: Bearer TOKEN`; the scheme is case-insensitive
    (RFC 9110 section 11.1)."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


KEYED_DEV_PATHS = frozenset({"/reset_prefix_cache"})


class ApiKeyMiddleware:
    """Require `Authorization: Bearer KEY` on /v1/* and the dev endpoints (as vLLM's
    --api-key); /health and /metrics stay open for probes and scrapers."""

    def __init__(self, app, api_key: str):
        self.app, self._expected = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope["path"].startswith("/v1")
                                        or scope["path"] in KEYED_DEV_PATHS):
            got = bearer_token(dict(scope["headers"]).get(b"authorization", b"")) or b""
            if not secrets.compare_digest(got, self._expected):
                return await _send_error(send, OpenAIError(
                    401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                    code="invalid_api_key"))
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413: at once from Content-Length, or while
    reading a chunked body (the handler's body read raises HTTPException(413))."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _message(self) -> str:
        return f"request body is larger than the server's limit of {self.max_bytes} bytes"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(send, OpenAIError(413, self._message(),
                                                       code=_CODES[413]))
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises an HTTPException from its body read as is
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)

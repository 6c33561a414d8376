"""OpenAI-format errors: {"error": {"message", "type", "param", "code"}} with the right status.

Every failure leaves the server in this shape: engine InvalidRequestError and the request
models' msgspec validation (body.parse_body) -> 400 (not FastAPI's 422), missing/wrong API
key -> 401, unknown model or path (a trailing slash included: no redirect) -> 404, body
over the limit -> 413, waiting queue over --max-waiting -> 429, engine stopped -> 503; a
client that leaves while its body is read gets 499 (logged, no traceback). The API-key check and the body limit are in a plain ASGI middleware (gate.py),
so they act before FastAPI reads or parses anything.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from engine.config import InvalidRequestError

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


REQUEST_TOO_LARGE = "request_too_large"
_CODES = {413: REQUEST_TOO_LARGE, 404: "not_found", 405: "method_not_allowed"}


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


def invalid(message: str, param: str | None) -> InvalidRequestError:
    """A 400 about request field `param` (param_of reads it back)."""
    exc = InvalidRequestError(message)
    exc.param = param
    return exc


def error_response(exc: OpenAIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def param_of(exc: Exception, fields: frozenset[str]) -> str | None:
    """The request field an engine/server 400 is about: its own `param`, else the field
    of `fields` (the request bodies' names) its message starts with ("temperature must
    be in ...", "prompt: ...")."""
    param = getattr(exc, "param", None)
    if param:
        return param
    first = str(exc).split(" ", 1)[0].rstrip(":,")
    return first if first in fields else None


def install_handlers(app: FastAPI, fields: frozenset[str]) -> None:
    """OpenAI's error format for every failure; `fields`: the request bodies' field names
    (roseplay/serve/protocol.py), to name the one a message is about."""
    @app.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError):
        return error_response(exc)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError):
        return error_response(OpenAIError(400, str(exc), param=param_of(exc, fields)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # still a bug (Starlette logs the traceback), but the client gets OpenAI's format
        return error_response(OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect):
        # the client left while its body was read: nobody reads an answer, and it is
        # no server error (no traceback); 499 as nginx logs it
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = str(exc.detail)
        if exc.status_code == 404:
            message = _not_found(app, request.scope)
        # the exception's headers stay: a 405's Allow (RFC 9110 15.5.6: it MUST be sent)
        return error_response(OpenAIError(exc.status_code, message,
                                          code=_CODES.get(exc.status_code)),
                              _sorted_allow(exc.headers))


def _sorted_allow(headers: dict | None) -> dict | None:
    """Allow's methods in one order (Starlette joins a route's set of methods, whose
    order changes with the process's hash seed)."""
    if not headers or "Allow" not in headers:
        return headers
    methods = sorted(m.strip() for m in headers["Allow"].split(","))
    return {**headers, "Allow": ", ".join(methods)}


def _not_found(app: FastAPI, scope) -> str:
    """404's message; a known route with a trailing slash says which path it meant (the
    app does not redirect: a 307 with an empty body is no answer an OpenAI client reads)."""
    path = scope["path"]
    bare = {**scope, "path": path.rstrip("/")}
    if bare["path"] != path and any(r.matches(bare)[0] is not Match.NONE
                                    for r in app.router.routes):
        return f"Not Found: {path} (the route is {bare['path']}, without the trailing slash)"
    return f"Not Found: {path}"

"""build_app(loop, ServeConfig): the FastAPI app over an engine front (EngineLoop).

The app does not own the engine: whoever built the loop closes it (server.py does,
after uvicorn has stopped), so tests can read the engine's snapshot around requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from roseplay.serve import chat
from roseplay.serve.bridge import DEFAULT_MAX_STREAM_BACKLOG, EngineBridge
from roseplay.serve.errors import OpenAIError, install_handlers
from roseplay.serve.gate import GateMiddleware
from roseplay.serve.metrics import ServerMetrics
from roseplay.serve.prompts import SamplingDefaults
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest
from roseplay.serve.request_ids import RequestIdMiddleware
from roseplay.serve.responses_api import RESPONSES, ResponsesRequest, responses_router
from roseplay.serve.routes import GENERATE, openapi_paths, router
from roseplay.serve.routing import routing_router
from roseplay.serve.server_info import server_info_router
from roseplay.serve.tokenize import tokenize_router
from roseplay.serve.shutdown import DEFAULT_SHUTDOWN_TIMEOUT_S, Drain

if TYPE_CHECKING:      # the client API both transports implement
    from engine.front.api import EngineAPI

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5        # as uvicorn's and vLLM's
DEFAULT_TIMEOUT_REQUEST_READ_S = 30.0   # headers + body of one request (slow-loris)
HTTP_PARSERS = ("httptools", "h11")
DEFAULT_HTTP = "httptools"              # C (llhttp): ~2/3 of h11's server CPU per request


@dataclass(frozen=True)
class ServeConfig:
    """The server's own settings (engine knobs live in engine/config.py)."""
    api_key: str | None = None
    served_model_name: tuple[str, ...] = ()     # default: the engine's model name
    max_waiting: int | None = None              # 429 above this many requests without a token
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_stream_backlog: int = DEFAULT_MAX_STREAM_BACKLOG    # unread tokens of one stream
    chat_template: str | None = None            # a Jinja file or string (see chat.py)
    # template variables under every request's chat_template_kwargs (vLLM's flag)
    default_chat_template_kwargs: dict | None = None
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S     # drain time on SIGTERM
    timeout_keep_alive: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S  # idle keep-alive connection
    timeout_request_read: float = DEFAULT_TIMEOUT_REQUEST_READ_S
    http: str = DEFAULT_HTTP                    # uvicorn's HTTP/1.1 parser: httptools or h11
    # CORS for browser clients (vLLM's --allowed-*): none by default, see docs/SERVE.md
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allowed_credentials: bool = False
    enable_request_id_headers: bool = False     # X-Request-Id on every response (vLLM's)
    # logprobs name tokens "token_id:N" unless a request says otherwise (vLLM's flag)
    return_tokens_as_token_ids: bool = False
    # usage.prompt_tokens_details.cached_tokens where the prefix cache served any (vLLM's)
    enable_prompt_tokens_details: bool = False
    # every stream ends with its usage chunk, stream_options or not (vLLM's)
    enable_force_include_usage: bool = False
    # a chat's tools stay out of its template with tool_choice none (vLLM's flag)
    exclude_tools_when_tool_choice_none: bool = False

    def __post_init__(self):
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            value = getattr(self, name)     # (a list after a JSON round trip: multiproc.py)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of strings, got {value!r:.80}")
            object.__setattr__(self, name, tuple(value))
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        if self.max_stream_backlog < 1:
            raise ValueError("max_stream_backlog must be >= 1")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
        if self.timeout_keep_alive <= 0 or self.timeout_request_read <= 0:
            raise ValueError("timeout_keep_alive and timeout_request_read must be > 0")
        if self.http not in HTTP_PARSERS:
            raise ValueError(f"http must be one of {', '.join(HTTP_PARSERS)}")
        try:
            chat.check_default_kwargs(self.default_chat_template_kwargs)
        except ValueError as exc:
            raise ValueError(f"default_chat_template_kwargs: {exc}") from None


class ServeState:
    """What the routes read: the engine front, its tokenizer and template, metrics."""

    def __init__(self, loop: EngineAPI, config: ServeConfig):
        info = loop.info
        self.loop, self.config = loop, config
        self.tokenizer = loop.tokenizer
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        # whose library checks a constraint at submit (constrained.check_on_loop)
        self.grammar_backend = info.structured_outputs_backend
        # the model's generation-config defaults for what requests leave out (prompts.py)
        self.sampling_defaults = SamplingDefaults.of(info)
        self.model_names = config.served_model_name or (info.model_name,)
        self.chat_template = chat.pick_template(self.tokenizer, chat.load_template(
            config.chat_template))
        self.template_defaults = config.default_chat_template_kwargs or {}
        self.metrics = ServerMetrics(loop, self.model_names[0], self.max_model_len)
        self.bridge = EngineBridge(loop, self.metrics, config.max_waiting,
                                   config.max_stream_backlog)
        self.drain = Drain()

    def check_model(self, name: str | None) -> str:
        """The served name a request asks for; one that leaves `model` out (or null) gets
        the first, as vLLM's server (OpenAI requires the field; vLLM's clients skip it)."""
        if name is None:
            return self.model_names[0]
        if name not in self.model_names:
            raise OpenAIError(404, f"The model `{name}` does not exist. Served: "
                                   f"{', '.join(self.model_names)}", code="model_not_found",
                              param="model")
        return name

    def engine_error(self) -> str | None:
        return getattr(self.loop, "fatal_error", None)


def build_app(loop: EngineAPI, config: ServeConfig | None = None) -> FastAPI:
    config = config or ServeConfig()
    # no trailing-slash redirects: POST /v1/completions/ is a 404 in OpenAI's format
    # naming the route, not a 307 with an empty body
    app = FastAPI(title="roseplay", description="OpenAI-compatible server on the roseplay engine",
                  docs_url=None, redoc_url=None, redirect_slashes=False)
    app.state.serve = ServeState(loop, config)
    install_handlers(app, frozenset(CompletionRequest.__struct_fields__
                                    + ChatCompletionRequest.__struct_fields__
                                    + ResponsesRequest.__struct_fields__))
    app.include_router(router)
    app.include_router(responses_router)
    app.include_router(routing_router)
    app.include_router(tokenize_router)
    app.include_router(server_info_router)
    app.add_middleware(GateMiddleware, drain=app.state.serve.drain,
                       max_bytes=config.max_body_bytes, api_key=config.api_key)
    if config.enable_request_id_headers:    # around the gate: its 401/413/503 carry it too
        app.add_middleware(RequestIdMiddleware)
    if config.allowed_origins:      # outermost: a preflight never meets the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=list(config.allowed_methods),
                           allow_headers=list(config.allowed_headers),
                           allow_credentials=config.allowed_credentials)
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema plus the generation routes with their msgspec request models."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        paths, components = openapi_paths({**GENERATE, **RESPONSES})
        schema["paths"] = {**paths, **schema.get("paths", {})}
        schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return app.openapi_schema

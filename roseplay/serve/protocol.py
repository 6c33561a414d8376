"""OpenAI request models (msgspec) and response models (pydantic), as vLLM's protocol.py.

Requests accept OpenAI's fields plus vLLM's sampling extras (top_k, ignore_eos,
stop_token_ids, return_token_ids, repetition_penalty, min_p, min_tokens). Fields the
engine cannot honour (tools, suffix, JSON response formats) are
refused with a clear 400 rather than silently ignored. Unknown fields are ignored, as
OpenAI and vLLM do.
Types are strict (JSON's): `true` is not an integer and `"5"` not a number, so a
client's type mistake gets a 400 naming the field instead of a surprising meaning.
Request bodies are msgspec Structs decoded from the raw bytes in one typed pass
(`parse_body`): ~15x cheaper than json.loads + pydantic for a 512-id prompt, which
every request pays before its first token (docs/SERVE.md "Admission").
"""
from __future__ import annotations

import json
import re
import time
from typing import Annotated, Literal

import msgspec
from msgspec import Meta
from pydantic import BaseModel, Field

from engine.config import InvalidRequestError
from engine.request import SamplingParams
from engine.validation import MAX_LOGPROBS
from roseplay.serve.errors import invalid
from roseplay.serve.logprobs import parse_logit_bias

MAX_N = 128     # choices per request (each one is an engine request)


def _check_utf8(value, param: str) -> None:
    """Refuse lone surrogates (JSON's "\\ud800" escapes decode to them): no tokenizer,
    stop matcher or wire codec can encode them to UTF-8."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid(f"{param} is not valid Unicode (a lone surrogate)",
                              param) from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            if type(item) is not int:       # token-id prompts: nothing to check, skip fast
                _check_utf8(item, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_utf8(key, param)
            _check_utf8(item, param)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _check_utf8(getattr(value, name), param)


class _Request(msgspec.Struct, kw_only=True):
    """msgspec decodes strictly and ignores unknown fields by default."""


class StreamOptions(_Request, kw_only=True):
    include_usage: bool = False


class SamplingFields(_Request, kw_only=True):
    """What both endpoints share."""
    model: str
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                 # vLLM extra
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extra
    ignore_eos: bool = False                 # vLLM extra
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float | None = None  # vLLM extras: repetition_penalty, min_p, min_tokens
    min_p: float | None = None
    min_tokens: int = 0
    return_token_ids: bool = False           # vLLM extra: token ids in every choice/chunk
    priority: int = 0                        # vLLM extra: lower first (scheduling_policy=priority)
    user: str | None = None

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true")

    def sampling_params(self, max_tokens: int, seed_offset: int = 0) -> SamplingParams:
        """One choice's SamplingParams (choice i of a seeded request gets seed + i)."""
        seed = None if self.seed is None else self.seed + seed_offset
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=-1 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=parse_logit_bias(self.logit_bias),
            min_p=self.min_p or 0.0, min_tokens=self.min_tokens,
            logprobs=self.engine_logprobs, prompt_logprobs=self.prompt_logprobs_asked)

    @property
    def num_logprobs(self) -> int | None:
        """Top logprobs per token the response shows (None: no logprobs)."""
        return None

    @property
    def prompt_logprobs_asked(self) -> int | None:
        """Top-n of each prompt token's logprobs (completions echo + logprobs)."""
        return None

    @property
    def num_candidates(self) -> int:
        """Engine requests per prompt (best_of, else n)."""
        return self.n

    @property
    def engine_logprobs(self) -> int | None:
        """What each engine request asks for: best_of ranks candidates by their
        cumulative logprob, so it needs at least the sampled tokens' logprobs."""
        n = self.num_logprobs
        return 0 if n is None and self.num_candidates > self.n else n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# one array type per msgspec union: the kind of list (all strings, all ids, all id
# lists) is checked in check_supported
PromptType = str | list[str | int | list[int]]


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: PromptType
    max_tokens: int | None = 16              # OpenAI's default for completions
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and len(set(map(type, self.prompt))) > 1:
            raise invalid("prompt must be a string, a list of strings, a list of token ids "
                          "or a list of token-id lists (not a mix)", "prompt")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported by this engine")
        if self.best_of is not None:
            if self.best_of < self.n:
                raise invalid(f"best_of must be >= n, got best_of={self.best_of}, "
                              f"n={self.n}", "best_of")
            if self.best_of > self.n and self.stream:
                raise invalid("best_of > n cannot be streamed (OpenAI, vLLM)", "best_of")
            if self.best_of > 1 and self.temperature == 0:
                raise invalid("best_of must be 1 with greedy sampling (temperature 0): "
                              "every candidate would be the same", "best_of")

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprobs_asked(self) -> int | None:
        return self.logprobs if self.echo else None

    @property
    def num_candidates(self) -> int:
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list: one string or token-id list per prompt."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise InvalidRequestError("prompt is empty")
        return list(p)


class TextPart(_Request, kw_only=True):
    type: Literal["text"]
    text: str


class ChatMessage(_Request, kw_only=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None
    add_generation_prompt: bool = True       # vLLM extra

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        if self.tools:
            raise InvalidRequestError("tools are not supported by this engine")
        if self.tool_choice not in (None, "none", "auto"):
            # "required" or a named tool with no tools: OpenAI refuses it too
            raise InvalidRequestError(f"tool_choice {self.tool_choice!r} needs tools, and "
                                      "tools are not supported by this engine")
        if self.response_format and self.response_format.get("type") != "text":
            raise InvalidRequestError("response_format: only {'type': 'text'} is supported")

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


_AT = re.compile(r"^(.*?)(?: - at `\$\.?([^`]*)`)?$", re.S)
_MISSING = re.compile(r"missing required field `(\w+)`")


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_body(model: type[_Request], body: bytes) -> _Request:
    """The request model from the raw body, or a 400 naming the field (`param`).
    msgspec refuses JSON's lone-surrogate escapes as malformed, so such a body is read
    again by the json module and its strings checked: a 400 that names the field."""
    try:
        return msgspec.json.decode(body, type=model)
    except msgspec.ValidationError as exc:
        raise _field_error(exc) from None
    except msgspec.DecodeError:
        pass
    try:
        obj = json.loads(body, parse_constant=_no_constant)
    except ValueError as exc:
        where = f" at character {exc.pos}" if hasattr(exc, "pos") else ""
        raise invalid(f"JSON decode error{where}: {getattr(exc, 'msg', exc)}", None) from None
    try:
        req = msgspec.convert(obj, type=model)
    except msgspec.ValidationError as exc:
        raise _field_error(exc) from None
    for name in req.__struct_fields__:
        _check_utf8(getattr(req, name), name)
    return req


def _field_error(exc: msgspec.ValidationError) -> InvalidRequestError:
    """msgspec's "Expected `int`, got `bool` - at `$.max_tokens`" -> "max_tokens:
    Expected `int`, got `bool`" with param "max_tokens" (the top-level field)."""
    message, path = _AT.match(str(exc)).groups()
    if path:
        return invalid(f"{path}: {message}", re.match(r"\w*", path).group() or None)
    missing = _MISSING.search(message)
    return invalid(message, missing.group(1) if missing else None)


def openapi_schemas(models: tuple[type[_Request], ...]) -> tuple[list[dict], dict]:
    """The models' JSON schemas for /openapi.json: a $ref per model, and the components
    they refer to (FastAPI never sees the models: the routes decode raw bodies)."""
    refs, components = msgspec.json.schema_components(
        models, ref_template="#/components/schemas/{name}")
    return list(refs), components


# -- responses -----------------------------------------------------------------------
# vLLM's `token_ids` extra appears in a choice only when the request asked for it
_TOKEN_IDS = Field(None, exclude_if=lambda v: v is None)

class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _TOKEN_IDS    # only with return_token_ids


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: dict | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _TOKEN_IDS


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: dict | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _TOKEN_IDS


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "roseplay"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]

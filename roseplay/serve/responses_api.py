"""POST /v1/responses, OpenAI's Responses API (as vLLM serves it without a store): the
request model, its translation into the chat request it runs as, and the routes.

A Responses request is a chat: `instructions` becomes a system message, `input` (a
string, or message items whose content is a string or input_text parts) the turns
after it, `max_output_tokens` the output's length, `text.format` the output's format
(chat's response_format, so docs/STRUCTURED_OUTPUTS.md holds), and vLLM's sampling
extras pass through. It then takes the chat path (routes.generate: template, limits,
engine, disconnects, drain) and roseplay/serve/responses_events.py writes the Response
object or its SSE events.

What the engine cannot honour is a 400 naming the field, never ignored: tools, stored
responses (store, previous_response_id, conversation, background and GET/DELETE of
/v1/responses/{id}, a 404), reasoning, prompt templates, non-text input (input_image,
input_file, input_audio) and items other than messages, truncation "auto" (the engine
drops no input items to fit), service tiers. Unknown fields are ignored, as OpenAI and
vLLM do; stream_options (include_obfuscation) is ignored too: nothing is padded.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from fastapi import APIRouter, Request
from msgspec import Meta

from engine.front.chat_template import join_parts
from engine.validation import MAX_LOGPROBS, MAX_STOP_STRINGS
from roseplay.serve import constrained
from roseplay.serve.body import json_body, raw_field
from roseplay.serve.errors import OpenAIError, invalid
from roseplay.serve.messages import MAX_CONTENT_PARTS, MAX_MESSAGES, ChatMessage, _Request
from roseplay.serve.protocol import ChatCompletionRequest, is_set
from roseplay.serve.responses_events import ResponsesFormat
from roseplay.serve.routes import chat_inputs, generate

ROLES = ("user", "system", "developer", "assistant")
LOGPROBS_INCLUDE = "message.output_text.logprobs"   # the one `include` value served
MAX_METADATA = 16                                   # OpenAI's bound on metadata pairs
_encode = msgspec.json.Encoder().encode


class InputPart(_Request, kw_only=True):
    """A content part: input_text (output_text in an assistant message handed back);
    any other type is refused by name in `_text`."""
    type: str
    text: str | None = None


class InputItem(_Request, kw_only=True):
    """An input item: a message ({"role", "content"}, `type` "message" or left out);
    other types (function_call, reasoning, item_reference, ...) are refused by name."""
    type: str = "message"
    role: str | None = None
    content: str | Annotated[list[InputPart], Meta(max_length=MAX_CONTENT_PARTS)] | None = None


class ResponsesRequest(_Request, kw_only=True):
    """OpenAI's create-response body (and vLLM's sampling extras)."""
    NULL_DEFAULTS = {"stream": False, "parallel_tool_calls": True}
    # set (not null, false or empty), these ask for what this server cannot do
    REFUSED: ClassVar[dict[str, str]] = {
        "tools": "tools are not supported by this server (no tool calling on /v1/responses)",
        "previous_response_id": "responses are not stored by this server: send the "
                                "earlier turns in `input`",
        "conversation": "conversations are not stored by this server: send the earlier "
                        "turns in `input`",
        "store": "responses are not stored by this server: send store false or leave it out",
        "background": "background responses need a store, which this server does not have",
        "prompt": "prompt templates are not supported by this server",
        "cache_salt": "cache_salt is not supported by this engine (its prefix cache is "
                      "shared by every request)"}
    model: str | None = None        # left out or null: the first served name (as vLLM)
    input: str | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    text: raw_field({"type": "object"}) = msgspec.UNSET
    include: Annotated[list[str], Meta(max_length=8)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=MAX_METADATA)] | None = None
    user: str | None = None
    tool_choice: raw_field({"anyOf": [{"type": "string"}, {"type": "object"}]}) = msgspec.UNSET
    parallel_tool_calls: bool | None = True
    max_tool_calls: int | None = None
    reasoning: raw_field({"type": "object"}) = msgspec.UNSET
    truncation: str | None = None
    service_tier: str | None = None
    tools: raw_field({"type": "array"}) = msgspec.UNSET
    previous_response_id: str | None = None
    conversation: raw_field({"anyOf": [{"type": "string"}, {"type": "object"}]}) = msgspec.UNSET
    store: bool | None = None
    background: bool | None = None
    prompt: raw_field({"type": "object"}) = msgspec.UNSET
    # vLLM's extras on /v1/responses
    top_k: int | None = None
    seed: int | None = None     # [MIN_SEED, MAX_SEED]: SamplingParams checks it
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    logit_bias: raw_field({"type": "object"}) = msgspec.UNSET
    structured_outputs: raw_field({"type": "object"}) = msgspec.UNSET
    priority: int = 0
    include_stop_str_in_output: bool | None = False
    data_parallel_rank: int | None = None     # roseplay extra (docs/ROUTING.md)
    request_id: str | None = None             # vLLM extra: the response's id (X-Request-Id wins)
    cache_salt: str | None = None             # vLLM extra, REFUSED

    def as_chat(self) -> "ResponsesChat":
        """The chat request this runs as; a 400 naming the field for what it cannot do."""
        for name, why in self.REFUSED.items():
            if is_set(getattr(self, name)):
                raise invalid(why, name)
        self._check_options()
        logprobs = self._logprobs()
        return ResponsesChat(
            model=self.model, messages=self.messages(),
            max_completion_tokens=self.max_output_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            stop=self.stop, ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.logit_bias, structured_outputs=self.structured_outputs,
            response_format=self._response_format(), stream=self.stream, user=self.user,
            priority=self.priority, data_parallel_rank=self.data_parallel_rank,
            logprobs=logprobs, top_logprobs=self.top_logprobs if logprobs else None,
            request_id=self.request_id and self.request_id.removeprefix("resp_"), source=self)

    def _check_options(self) -> None:
        choice = constrained.decode_small(self.tool_choice, "tool_choice")
        if choice not in (None, "auto", "none"):
            raise invalid("tool_choice must be auto or none: tools are not supported by "
                          "this server", "tool_choice")
        reasoning = constrained.decode_small(self.reasoning, "reasoning")
        if reasoning is not None and (not isinstance(reasoning, dict) or any(
                v is not None for v in reasoning.values())):
            raise invalid("reasoning is not supported by this server (the model does not "
                          "reason apart from its answer)", "reasoning")
        if self.truncation not in (None, "disabled"):
            raise invalid("truncation must be disabled: the engine does not drop input "
                          "items to fit the context (a prompt over it is a 400)", "truncation")
        if self.service_tier not in (None, "auto", "default"):
            raise invalid("service_tier must be auto or default: this server has one tier",
                          "service_tier")

    def _logprobs(self) -> bool:
        """Whether output_text carries logprobs (include message.output_text.logprobs)."""
        other = [v for v in self.include or () if v != LOGPROBS_INCLUDE]
        if other:
            raise invalid(f"include: only {LOGPROBS_INCLUDE} is supported by this server, "
                          f"got {other[0][:60]!r}", "include")
        asked = LOGPROBS_INCLUDE in (self.include or ())
        if self.top_logprobs and not asked:
            raise invalid(f"top_logprobs needs include: [{LOGPROBS_INCLUDE!r}]", "top_logprobs")
        return asked

    def text_format(self) -> dict | None:
        """text.format, decoded (None: plain text)."""
        text = constrained.decode_small(self.text, "text")
        if text is None:
            return None
        if not isinstance(text, dict):
            raise invalid("text must be an object ({\"format\": {...}})", "text")
        if text.get("verbosity") not in (None, "medium"):
            raise invalid("text.verbosity is not supported by this server (only medium, "
                          "the default)", "text")
        return text.get("format")

    def _response_format(self):
        """text.format as chat's response_format (raw JSON), UNSET for plain text."""
        fmt = self.text_format()
        if fmt is None:
            return msgspec.UNSET
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema":
            if not isinstance(fmt.get("schema"), (dict, bool)):
                raise invalid("text.format json_schema needs a schema (a JSON schema "
                              "object)", "text")
            fmt = {"type": kind, "json_schema": {
                k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
        elif kind not in ("text", "json_object"):
            raise invalid(f"text.format type must be text, json_object or json_schema, got "
                          f"{str(kind)[:40]!r}", "text")
        return msgspec.Raw(_encode(fmt))

    def messages(self) -> list[ChatMessage]:
        """instructions as a system message, then the input's turns."""
        head = [] if self.instructions is None else [
            ChatMessage(role="system", content=self.instructions)]
        if isinstance(self.input, str):
            return head + [ChatMessage(role="user", content=self.input)]
        return head + [_message(i, item) for i, item in enumerate(self.input)]


def _message(i: int, item: InputItem) -> ChatMessage:
    where = f"input[{i}]"
    if item.type != "message":
        raise invalid(f"{where}: items of type {item.type[:40]!r} are not supported by this "
                      "server (messages only: no tools, reasoning or item references)", "input")
    if item.role not in ROLES:
        raise invalid(f"{where}.role must be one of {', '.join(ROLES)}, got "
                      f"{str(item.role)[:40]!r}", "input")
    return ChatMessage(role=item.role, content=_text(where, item))


def _text(where: str, item: InputItem) -> str:
    if not isinstance(item.content, list):
        return item.content or ""
    kinds = ("input_text", "output_text") if item.role == "assistant" else ("input_text",)
    for j, part in enumerate(item.content):
        if part.type not in kinds:
            raise invalid(f"{where}.content[{j}]: {part.type[:40]!r} parts are not supported "
                          f"by this model (it reads text: {' or '.join(kinds)} parts)", "input")
        if part.text is None:
            raise invalid(f"{where}.content[{j}]: the {part.type} part has no text", "input")
    return join_parts(part.text for part in item.content)


class ResponsesChat(ChatCompletionRequest, kw_only=True):
    """The chat request a Responses request runs as: its 400s name the Responses fields
    (max_output_tokens, text), and `source` is the request the response echoes."""
    FORMAT_FIELD, PROMPT_FIELD = "text", "input"
    source: Any = None

    @property
    def max_tokens_field(self) -> str:
        return "max_output_tokens"


async def create_response(request: Request):
    req = await json_body(request, ResponsesRequest)
    return await generate(request, ResponsesFormat, req.as_chat(), chat_inputs)


async def not_stored(request: Request):
    """GET/DELETE /v1/responses/{id} (and its cancel, input_items): nothing is stored,
    so no id is found (vLLM without VLLM_ENABLE_RESPONSES_API_STORE answers the same)."""
    rid = request.path_params["response_id"]
    raise OpenAIError(404, f"Response with id {rid[:80]!r} not found: this server does not "
                           "store responses", code="not_found", param="response_id")


# {path: (endpoint, request model)}, as routes.GENERATE (app.py: /openapi.json)
RESPONSES = {"/v1/responses": (create_response, ResponsesRequest)}
responses_router = APIRouter()
responses_router.add_route("/v1/responses", create_response, methods=["POST"],
                           include_in_schema=False)
responses_router.add_route("/v1/responses/{response_id}", not_stored, methods=["GET", "DELETE"],
                           include_in_schema=False)
for _tail, _method in (("cancel", "POST"), ("input_items", "GET")):
    responses_router.add_route(f"/v1/responses/{{response_id}}/{_tail}", not_stored,
                               methods=[_method], include_in_schema=False)

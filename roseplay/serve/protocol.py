"""OpenAI request models (msgspec), as vLLM's protocol.py (responses: responses.py).

Requests accept OpenAI's fields plus vLLM's sampling extras (top_k, ignore_eos,
stop_token_ids, return_token_ids, repetition_penalty, min_p, min_tokens) and structured
outputs (response_format, vLLM's structured_outputs, chat's tools/tool_choice:
roseplay/serve/constrained.py, tools.py). Fields the engine cannot honour (suffix, and
vLLM's extras in REFUSED when set) are refused with a clear 400 rather than silently
ignored. Unknown fields are ignored, as OpenAI and vLLM do.
Types are strict (JSON's): `true` is not an integer and `"5"` not a number, so a
client's type mistake gets a 400 naming the field instead of a surprising meaning.
Request bodies are msgspec Structs decoded from the raw bytes in one typed pass
(roseplay/serve/body.py `parse_body`); every list carries its bound as msgspec `Meta`,
and the fields that are costly to build and refused when large (logit_bias, tools,
tool_choice, response_format, structured_outputs) are kept raw until their size is known.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from engine.config import InvalidRequestError
from engine.request import SamplingParams, sample_seed
from engine.validation import (MAX_LOGIT_BIAS_ENTRIES, MAX_LOGPROBS, MAX_STOP_STRINGS,
                               MAX_STOP_TOKEN_IDS, check_seed)
from roseplay.serve import chat, constrained
from roseplay.serve.tools import Tools
from roseplay.serve.body import parse_logit_bias, raw_field, raw_value
from roseplay.serve.errors import invalid
from roseplay.serve.messages import MAX_MESSAGES, ChatMessage, _Request

MAX_N = 128     # choices per request (each one is an engine request)
# the sampling fields a model's generation config gives defaults for (vLLM's
# to_sampling_params; max_tokens: roseplay/serve/prompts.py)
MODEL_DEFAULTED = ("temperature", "top_k", "top_p", "repetition_penalty", "min_p")


class StreamOptions(_Request, kw_only=True):
    NULL_DEFAULTS = {"include_usage": False, "continuous_usage_stats": False}
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False     # vLLM extra: usage in every chunk


class SamplingFields(_Request, kw_only=True, dict=True):
    """What both endpoints share (dict=True: check_supported keeps what it parsed)."""
    NULL_DEFAULTS = {"n": 1, "stream": False, "return_token_ids": False}
    # vLLM extras the engine cannot honour: ignored as unknown fields, they gave another
    # answer than asked (the stop string cut, no beam search, every token allowed)
    REFUSED: ClassVar[tuple[str, ...]] = ("use_beam_search", "allowed_token_ids", "bad_words",
                                          "cache_salt", "logits_processors")
    # the request field OpenAI's output format is read from (a grammar error's param):
    # response_format here, `text` for /v1/responses (roseplay/serve/responses_api.py)
    FORMAT_FIELD: ClassVar[str] = "response_format"
    PROMPT_FIELD: ClassVar[str] = "prompt"     # the field that holds the prompt (a 400's param)
    model: str | None = None        # left out or null: the first served name (as vLLM)
    n: Annotated[int, Meta(ge=1, le=MAX_N)] | None = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                 # vLLM extra
    seed: int | None = None      # check_seed: check_supported
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[int], Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False                 # vLLM extra
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: raw_field({"type": "object", "additionalProperties": {"type": "number"},
                           "maxProperties": MAX_LOGIT_BIAS_ENTRIES}) = msgspec.UNSET
    repetition_penalty: float | None = None  # vLLM extras: repetition_penalty, min_p, min_tokens
    min_p: float | None = None
    min_tokens: int = 0
    return_token_ids: bool | None = False           # vLLM extra: token ids in every choice/chunk
    # vLLM extra: logprobs name each token "token_id:N" (null: the server's
    # --return-tokens-as-token-ids, which routes.generate sets)
    return_tokens_as_token_ids: bool | None = None
    priority: int = 0                        # vLLM extra: lower first (scheduling_policy=priority)
    data_parallel_rank: int | None = None    # roseplay extra: the replica that serves it
    #                                          (--data-parallel-size; docs/ROUTING.md)
    user: str | None = None
    request_id: str | None = None            # vLLM extra: the response id's base
    #                                          (X-Request-Id wins; request_ids.py)
    # structured outputs, raw until their size is known (roseplay/serve/constrained.py)
    response_format: raw_field({"type": "object"}) = msgspec.UNSET
    structured_outputs: raw_field({"type": "object"}) = msgspec.UNSET   # vLLM extra
    # vLLM's older spelling of structured_outputs, which clients still send
    guided_json: raw_field({"type": ["object", "string"]}) = msgspec.UNSET
    guided_regex: raw_field({"type": "string"}) = msgspec.UNSET
    guided_choice: raw_field({"type": "array", "items": {"type": "string"}}) = msgspec.UNSET
    guided_grammar: raw_field({"type": "string"}) = msgspec.UNSET
    guided_whitespace_pattern: str | None = None     # a guided_json's whitespace_pattern
    include_stop_str_in_output: bool | None = False      # vLLM extra: keep the stop text
    skip_special_tokens: bool = True         # vLLM extras: the output text's special
    spaces_between_special_tokens: bool = True   # tokens (SamplingParams' fields)
    use_beam_search: bool | None = None
    allowed_token_ids: raw_field({"type": "array"}) = msgspec.UNSET
    bad_words: raw_field({"type": "array"}) = msgspec.UNSET
    # vLLM extra: each prompt token's logprobs and the top n (not streamed)
    prompt_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    cache_salt: str | None = None     # vLLM's: a prefix-cache partition (not kept apart here)
    # vLLM's per-request logits processors (its v1 engine refuses them too)
    logits_processors: raw_field({"type": "array"}) = msgspec.UNSET
    truncate_prompt_tokens: int | None = None     # vLLM extra: keep the last k (-1: context)

    def check_supported(self) -> None:
        for name in self.REFUSED:
            if is_set(getattr(self, name)):
                raise invalid(f"{name} is not supported by this engine", name)
        self._constraint = self._parse_constraint()
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true")
        if self.prompt_logprobs and self.stream:      # as vLLM's (0 asks for nothing)
            raise invalid("prompt_logprobs are not available when stream is true",
                          "prompt_logprobs")
        check_seed(self.seed, self.num_candidates)

    def _parse_constraint(self) -> tuple:
        """(StructuredOutputsParams or None, the request field it comes from)."""
        fmt = self.FORMAT_FIELD
        found = [(c, field) for c, field in (
            (constrained.from_response_format(constrained.decode_small(
                self.response_format, fmt), fmt), fmt),
            (constrained.from_structured_outputs(constrained.decode_small(
                self.structured_outputs, "structured_outputs")), "structured_outputs"),
            constrained.from_guided({kind: getattr(self, "guided_" + kind)
                                     for kind in constrained.GUIDED},
                                    self.guided_whitespace_pattern)) if c is not None]
        if len(found) > 1:
            raise invalid(f"{found[0][1]} and {found[1][1]} both constrain the output; "
                          "send one", found[1][1])
        return found[0] if found else (None, None)

    @property
    def constraint(self):
        """The output's constraint (StructuredOutputsParams or None; check_supported)."""
        return self.__dict__.get("_constraint", (None, None))[0]

    @property
    def constraint_field(self) -> str | None:
        """The request field the constraint came from: a grammar error's param."""
        return self.__dict__.get("_constraint", (None, None))[1]

    def sampling_params(self, max_tokens: int, choice: int = 0,
                        logit_bias: dict[int, float] | None = None,
                        defaults: dict | None = None) -> SamplingParams:
        """The SamplingParams of a prompt's choice (or best_of candidate) `choice`: a
        seeded request's choice i gets seed + i; only choice 0 asks for the prompt's
        logprobs, which the routes show for all (one computation per prompt however
        large n: roseplay/serve/siblings.py). A field of MODEL_DEFAULTED the request
        leaves out (null) takes the model's default (`defaults`: its generation config,
        vLLM's default_sampling_params), else the engine's."""
        seed = sample_seed(self.seed, choice)
        given = {name: value for name in MODEL_DEFAULTED
                 if (value := getattr(self, name)) is not None}
        sampled = {name: value for name, value in (defaults or {}).items()
                   if name in MODEL_DEFAULTED} | given
        return SamplingParams(
            max_tokens=max_tokens, **sampled,
            seed=seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=logit_bias, min_tokens=self.min_tokens,
            logprobs=self.engine_logprobs,
            prompt_logprobs=self.prompt_logprobs_asked if choice == 0 else None,
            structured_outputs=self.constraint)

    def logit_bias_ids(self) -> dict[int, float] | None:
        """logit_bias with int keys (read once per request, shared by its choices)."""
        return parse_logit_bias(self.logit_bias)

    @property
    def num_logprobs(self) -> int | None:
        """Top logprobs per token the response shows (None: no logprobs)."""
        return None

    @property
    def prompt_logprobs_asked(self) -> int | None:
        """Top-n of each prompt token's logprobs the engine computes (for choice 0 of a
        prompt): vLLM's prompt_logprobs (not streamed), completions' echo + logprobs, the
        larger."""
        asked = [n for n in (self.echo_logprobs,
                             None if self.stream else self.prompt_logprobs) if n is not None]
        return max(asked) if asked else None

    @property
    def echo_logprobs(self) -> int | None:
        """Top-n of the echoed prompt's logprobs (completions' echo + logprobs)."""
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
    def echo_only(self) -> bool:
        """The response is the prompt alone (completions' echo with max_tokens 0)."""
        return False

    def force_include_usage(self) -> None:
        """vLLM's --enable-force-include-usage: a stream ends with its usage chunk even
        when stream_options leaves it out (continuous_usage_stats stays as asked)."""
        if self.stream:
            self.stream_options = self.stream_options or StreamOptions()
            self.stream_options.include_usage = True

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats (with include_usage): every chunk carries its
        choice's usage so far."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


def is_set(value) -> bool:
    """A refused extra asks for something: not absent, null, false or an empty list."""
    if isinstance(value, msgspec.Raw):
        return raw_value(value) not in (None, b"[]")
    return value is not None and value is not False and value is not msgspec.UNSET


# one array type per msgspec union: the kind of list (all strings, all ids, all id
# lists) is checked in check_supported
PromptType = str | list[str | int | list[int]]


class CompletionRequest(SamplingFields, kw_only=True):
    NULL_DEFAULTS = {**SamplingFields.NULL_DEFAULTS, "echo": False}
    prompt: PromptType
    max_tokens: int | None = 16              # OpenAI's default for completions
    echo: bool | None = False
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    suffix: str | None = None
    add_special_tokens: bool = True          # vLLM extra: the encode adds BOS (and such)

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
    def echo_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None

    @property
    def num_candidates(self) -> int:
        return self.best_of or self.n

    @property
    def echo_only(self) -> bool:
        """max_tokens 0 with echo: the prompt's text and logprobs alone (OpenAI's legacy
        scoring call; vLLM's too: the engine samples one token, which is dropped)."""
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list: one string or token-id list per prompt."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise InvalidRequestError("prompt is empty")
        return list(p)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    NULL_DEFAULTS = {**SamplingFields.NULL_DEFAULTS, "logprobs": False,
                     "parallel_tool_calls": True, "echo": False,
                     "continue_final_message": False}
    PROMPT_FIELD = "messages"
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    # tool calling (roseplay/serve/tools.py): kept raw, decoded once their size is known
    tools: raw_field({"type": "array", "items": {"type": "object"}}) = msgspec.UNSET
    tool_choice: raw_field({"anyOf": [{"type": "string"}, {"type": "object"}]}) = msgspec.UNSET
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True       # vLLM extra
    continue_final_message: bool | None = False  # vLLM extra: the reply goes on with the
    #                                              last message (chat.render)
    add_special_tokens: bool = False         # vLLM extra: true refused (check_supported)
    chat_template: str | None = None         # vLLM extra: refused (check_supported)
    # vLLM extra: template variables (enable_thinking, ...), kept raw: chat.template_kwargs
    chat_template_kwargs: raw_field({"type": "object"}) = msgspec.UNSET
    echo: bool | None = False                # vLLM extra: the reply repeats the last
    #                                          message first when it is the assistant's
    # template variables as vLLM passes them (chat.request_kwargs): OpenAI's
    # reasoning_effort, vLLM's documents (kept raw)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    documents: raw_field({"type": "array", "items": {"type": "object"}}) = msgspec.UNSET

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:     # 0 asks for nothing (as vLLM)
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        if self.chat_template is not None:     # as vLLM without --trust-request-chat-template
            raise invalid("chat_template: a template per request is not taken (a template "
                          "runs code on the server); start the server with --chat-template",
                          "chat_template")
        chat.check_continue(self.continue_final_message, self.add_generation_prompt)
        if self.add_special_tokens:      # as /tokenize: the template writes its own
            raise invalid("add_special_tokens: the chat template adds the special tokens "
                          "it wants (send false)", "add_special_tokens")
        self._template_kwargs = chat.request_kwargs(self.chat_template_kwargs, self.documents,
                                                    self.reasoning_effort)
        self._tools = Tools.parse(self.tools, self.tool_choice, self.parallel_tool_calls)
        tool_constraint = self._tools.constraint() if self._tools is not None else None
        if tool_constraint is not None:
            if self.constraint is not None:
                raise invalid(f"tool_choice {self._tools.mode} and {self.constraint_field} "
                              "both constrain the output; send one", "tool_choice")
            self._constraint = (tool_constraint, self._tools.field)

    @property
    def echo_text(self) -> str:
        """What vLLM's chat `echo` puts before each choice's content: the last message's
        text when its role is the reply's (assistant), else nothing."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    @property
    def template_kwargs(self) -> dict:
        """The template variables the request sets (check_supported)."""
        return self.__dict__.get("_template_kwargs") or {}

    @property
    def tool_spec(self):
        """The request's Tools (None without tools; check_supported)."""
        return self.__dict__.get("_tools")

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        """The request field requested_max_tokens came from (a 400's param)."""
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"


def openapi_schemas(models: tuple[type[_Request], ...]) -> tuple[list[dict], dict]:
    """The models' JSON schemas for /openapi.json: a $ref per model, and the components
    they refer to (FastAPI never sees the models: the routes decode raw bodies)."""
    refs, components = msgspec.json.schema_components(
        models, ref_template="#/components/schemas/{name}")
    return list(refs), components

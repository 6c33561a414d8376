"""OpenAI response models (pydantic), as vLLM's protocol.py: non-streamed responses,
/v1/models; streamed chunks are msgspec's with the same JSON (streaming.py)."""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field

# vLLM's `token_ids` and `prompt_token_ids` extras appear only when the request asked
# for them (return_token_ids)
_TOKEN_IDS = Field(None, exclude_if=lambda v: v is None)

class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0          # prompt tokens the prefix cache served


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # vLLM's --enable-prompt-tokens-details, set when the cache served any (else null)
    prompt_tokens_details: PromptTokensDetails | None = None


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens)


def stop_reason(choice) -> int | str | None:
    """vLLM's stop_reason of a finished choice: the stop string or stop_token_ids id that
    ended it (engine CompletionOutput.stop_reason); None for EOS, a length, or no stop."""
    out = getattr(choice, "output", None)
    return out.outputs[0].stop_reason if out is not None and out.outputs else None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None        # vLLM extra
    token_ids: list[int] | None = _TOKEN_IDS    # only with return_token_ids
    prompt_token_ids: list[int] | None = _TOKEN_IDS


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class DeltaMessage(BaseModel):
    role: str | None = Field(None, exclude_if=lambda v: v is None)   # the first delta's only
    content: str | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict] | None = Field(None, exclude_if=lambda v: v is None)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: dict | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None        # vLLM extra
    token_ids: list[int] | None = _TOKEN_IDS


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: dict | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None        # vLLM extra
    token_ids: list[int] | None = _TOKEN_IDS


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = _TOKEN_IDS     # vLLM extra: return_token_ids


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = _TOKEN_IDS     # a choice's first chunk


class ModelPermission(BaseModel):
    """vLLM's card lists one, OpenAI's old permission object with its defaults: clients
    written against vLLM read `permission[0]`."""
    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "roseplay"
    root: str | None = None         # vLLM's: the model the name serves (--model)
    parent: str | None = None       # vLLM's: the base model of an adapter (none here)
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]

"""POST /tokenize and POST /detokenize (vLLM's): a prompt's token ids as the engine gets
them (the encode of /v1/completions, or the chat template of /v1/chat/completions), and
token ids back to text. Clients use them to count a prompt against the context before
sending it. Keyed like /v1/* under --api-key (gate.py); a model without a tokenizer
(`dummy:*`) answers 400. Long inputs are handled on a worker thread, as generation's."""
from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from msgspec import Meta

from engine.validation import check_text
from roseplay.serve import chat
from roseplay.serve.body import json_body, raw_field
from roseplay.serve.errors import invalid
from roseplay.serve.prompts import check_vocab_ids, messages_on_loop, prompts_on_loop
from roseplay.serve.messages import MAX_MESSAGES, ChatMessage, _Request
from roseplay.serve.tools import Tools, message_dict

tokenize_router = APIRouter()
MAX_DETOKENIZE_IDS = 1 << 20


class TokenizeRequest(_Request, kw_only=True):
    """vLLM's TokenizeCompletionRequest or TokenizeChatRequest: `prompt` or `messages`."""
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: bool | None = None      # default: True for a prompt (the encode's)
    add_generation_prompt: bool = True          # messages: as chat completions' default
    continue_final_message: bool = False        # messages: as chat completions'
    chat_template_kwargs: raw_field({"type": "object"}) = msgspec.UNSET    # messages: as chat's
    # messages: the tools a chat sends, which templates write into the prompt (kept raw)
    tools: raw_field({"type": "array", "items": {"type": "object"}}) = msgspec.UNSET
    return_token_strs: bool = False


class DetokenizeRequest(_Request, kw_only=True):
    model: str | None = None
    tokens: Annotated[list[int], Meta(max_length=MAX_DETOKENIZE_IDS)]


def _checked(request: Request, model: str | None):
    st = request.app.state.serve
    st.check_model(model)
    if st.tokenizer is None:
        raise invalid("this model has no tokenizer: its prompts are token ids already",
                      "model")
    return st


def _ids(req: TokenizeRequest, st) -> list[int]:
    if (req.prompt is None) == (req.messages is None):
        raise invalid("send a prompt (text) or messages (a chat), one of them", "prompt")
    if req.prompt is not None:
        check_text("prompt", req.prompt)
        special = True if req.add_special_tokens is None else req.add_special_tokens
        return list(st.tokenizer.encode(req.prompt, add_special_tokens=special))
    if req.add_special_tokens:     # the template writes the special tokens it wants
        raise invalid("add_special_tokens: the chat template adds them (send false)",
                      "add_special_tokens")
    chat.check_continue(req.continue_final_message, req.add_generation_prompt)
    tools = Tools.parse(req.tools, msgspec.UNSET, True)
    _, ids = chat.render(st.tokenizer, st.chat_template, [message_dict(m) for m in req.messages],
                         req.add_generation_prompt,
                         tools.for_template() if tools is not None else None,
                         kwargs=chat.with_defaults(st.template_defaults,
                                                   chat.template_kwargs(req.chat_template_kwargs)),
                         continue_final_message=req.continue_final_message)
    return list(ids)


def _tokenized(req: TokenizeRequest, st) -> dict:
    ids = _ids(req, st)
    strs = st.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids,
            "token_strs": strs}


@tokenize_router.post("/tokenize")
async def tokenize(request: Request):
    req = await json_body(request, TokenizeRequest)
    st = _checked(request, req.model)
    small = messages_on_loop(req.messages) if req.messages is not None else \
        prompts_on_loop([req.prompt or ""])
    body = _tokenized(req, st) if small else await asyncio.to_thread(_tokenized, req, st)
    return JSONResponse(body)


@tokenize_router.post("/detokenize")
async def detokenize(request: Request):
    req = await json_body(request, DetokenizeRequest)
    st = _checked(request, req.model)
    ids = req.tokens
    check_vocab_ids(ids, st.vocab_size, "tokens")
    if prompts_on_loop([ids]):
        text = st.tokenizer.decode(ids)
    else:
        text = await asyncio.to_thread(st.tokenizer.decode, ids)
    return JSONResponse({"prompt": text})

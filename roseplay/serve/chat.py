"""Chat templates for /v1/chat/completions: `--chat-template` read here; the renderer and
the bundled model's play template are the engine's (engine/front/chat_template.py, which
LLM.chat uses too), each error a 400 about `messages`."""
from __future__ import annotations

from pathlib import Path

import msgspec

from engine.config import InvalidRequestError
from engine.front import chat_template
from engine.front.chat_template import PLAY_TEMPLATE, pick_template
from roseplay.serve.constrained import decode_small
from roseplay.serve.errors import invalid

__all__ = ["PLAY_TEMPLATE", "check_continue", "check_default_kwargs", "load_template",
           "pick_template", "render", "request_kwargs", "template_kwargs", "with_defaults"]
KWARGS_FIELD = "chat_template_kwargs"


def load_template(value: str | None) -> str | None:
    """`--chat-template`: a path to a Jinja file, or the template text itself."""
    if not value:
        return None
    try:
        is_file = len(value) < 4096 and Path(value).is_file()
    except OSError:      # a template text whose line is longer than a file name may be
        is_file = False
    return Path(value).read_text() if is_file else value


def template_kwargs(raw) -> dict:
    """vLLM's chat_template_kwargs (kept raw by the request models until its size is
    known): extra template variables, or a 400 naming the field."""
    try:
        return chat_template.check_template_kwargs(decode_small(raw, KWARGS_FIELD))
    except InvalidRequestError as exc:
        raise invalid(str(exc), KWARGS_FIELD) from None


def request_kwargs(raw_kwargs, raw_documents=msgspec.UNSET,
                   reasoning_effort: str | None = None) -> dict:
    """A chat request's template variables, as vLLM passes them: its `documents` (RAG
    templates read them) under its chat_template_kwargs, its `reasoning_effort` over
    them. Fields kept raw are decoded here (a 400 names the field)."""
    kwargs = template_kwargs(raw_kwargs)
    documents = decode_small(raw_documents, "documents")
    if documents is not None:
        if not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
            raise invalid("documents must be a list of objects (each a document's "
                          "fields, as {\"title\": ..., \"text\": ...})", "documents")
        kwargs = {"documents": documents, **kwargs}
    if reasoning_effort is not None:
        kwargs = {**kwargs, "reasoning_effort": reasoning_effort}
    return kwargs


def check_default_kwargs(defaults):
    """--default-chat-template-kwargs (null: none), checked once at start as a request's
    chat_template_kwargs is: a ValueError (exit 2) for what a request would get a 400 for."""
    try:
        return chat_template.check_template_kwargs(defaults)
    except InvalidRequestError as exc:
        raise ValueError(f"the default {exc}") from None


def with_defaults(defaults: dict, kwargs: dict) -> dict:
    """A request's chat_template_kwargs over --default-chat-template-kwargs: the
    request's win key by key, as vLLM merges them."""
    return {**defaults, **kwargs} if defaults else kwargs


def check_continue(continue_final_message: bool, add_generation_prompt: bool) -> None:
    """vLLM's continue_final_message goes on with the last message, so no new turn may
    be opened after it: a 400 naming the field, before the render (whose own refusal,
    the Python API's, would name `messages`)."""
    if continue_final_message and add_generation_prompt:
        raise invalid("continue_final_message and add_generation_prompt cannot both be "
                      "true (send add_generation_prompt: false)", "continue_final_message")


def render(tokenizer, template: str, messages: list[dict],
           add_generation_prompt: bool = True,
           tools: list[dict] | None = None, param: str = "messages",
           kwargs: dict | None = None,
           continue_final_message: bool = False) -> tuple[str, list[int]]:
    """The prompt text and its token ids (engine/front/chat_template.py render, `kwargs`
    its template_kwargs); a 400 names `param`, the request field the messages came
    from."""
    if tokenizer is None:
        raise invalid("this model has no tokenizer: /v1/chat/completions and /v1/responses "
                      "need one (use /v1/completions with token-id prompts)", param)
    try:
        return chat_template.render(tokenizer, template, messages, add_generation_prompt,
                                    tools, kwargs, continue_final_message)
    except InvalidRequestError as exc:
        raise invalid(str(exc), param) from None

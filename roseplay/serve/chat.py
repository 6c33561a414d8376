"""Chat templates for /v1/chat/completions: `--chat-template` read here; the renderer and
the bundled model's play template are the engine's (engine/front/chat_template.py, which
LLM.chat uses too), each error a 400 about `messages`."""
from __future__ import annotations

from pathlib import Path

from engine.config import InvalidRequestError
from engine.front import chat_template
from engine.front.chat_template import PLAY_TEMPLATE, pick_template
from roseplay.serve.constrained import decode_small
from roseplay.serve.errors import invalid

__all__ = ["PLAY_TEMPLATE", "check_default_kwargs", "load_template", "pick_template", "render",
           "template_kwargs", "with_defaults"]
KWARGS_FIELD = "chat_template_kwargs"


def load_template(value: str | None) -> str | None:
    """`--chat-template`: a path to a Jinja file, or the template text itself."""
    if not value:
        return None
    path = Path(value)
    if len(value) < 4096 and path.is_file():
        return path.read_text()
    return value


def template_kwargs(raw) -> dict:
    """vLLM's chat_template_kwargs (kept raw by the request models until its size is
    known): extra template variables, or a 400 naming the field."""
    try:
        return chat_template.check_template_kwargs(decode_small(raw, KWARGS_FIELD))
    except InvalidRequestError as exc:
        raise invalid(str(exc), KWARGS_FIELD) from None


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


def render(tokenizer, template: str, messages: list[dict],
           add_generation_prompt: bool = True,
           tools: list[dict] | None = None, param: str = "messages",
           kwargs: dict | None = None) -> tuple[str, list[int]]:
    """The prompt text and its token ids (engine/front/chat_template.py render, `kwargs`
    its template_kwargs); a 400 names `param`, the request field the messages came
    from."""
    if tokenizer is None:
        raise invalid("this model has no tokenizer: /v1/chat/completions and /v1/responses "
                      "need one (use /v1/completions with token-id prompts)", param)
    try:
        return chat_template.render(tokenizer, template, messages, add_generation_prompt, tools,
                                    kwargs)
    except InvalidRequestError as exc:
        raise invalid(str(exc), param) from None

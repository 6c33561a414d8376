"""Chat templates: messages -> prompt text -> token ids, for LLM.chat and the server's
/v1/chat/completions (roseplay/serve/chat.py adds the server's --chat-template file).

The template is, in order: the caller's, the tokenizer's own `chat_template`, else
PLAY_TEMPLATE. The bundled Shakespeare model was trained on plays, where a turn is a
speaker's name in capitals with a full stop on its own line, the speech, and a blank
line; PLAY_TEMPLATE writes a chat that way:

    {system text}\\n\\n                 (system / developer messages, as a stage note)
    ROMEO.\\n{user text}\\n\\n           (user turns)
    JULIET.\\n{assistant text}\\n\\n     (assistant turns; a tool call as a stage direction,
                                       "[She sends for NAME: {arguments}]")
    MESSENGER.\\n{tool result}\\n\\n    (tool messages: a tool's answer)
    JULIET.\\n                          (the generation prompt: Juliet answers)

so the model continues as Juliet. Her reply ends where the play's next speaker would
begin: pass stop=["\\n\\n"] to end it there (the model otherwise goes on with the scene).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime

from engine.config import InvalidRequestError
from engine.validation import check_text

PLAY_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] in ('system', 'developer') %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}ROMEO.\n{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'tool' %}MESSENGER.\n{{ m['content'] }}\n\n"
    "{% else %}JULIET.\n"
    "{% for c in m.get('tool_calls') or [] %}[She sends for {{ c['function']['name'] }}: "
    "{{ c['function']['arguments'] | tojson }}]\n{% endfor %}"
    "{{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}JULIET.\n{% endif %}"
)


ROLES = ("system", "developer", "user", "assistant", "tool")     # OpenAI's, as the server's


def conversations(messages) -> list[list[dict]]:
    """LLM.chat's messages: one conversation (a list of {"role", "content"} dicts) or a
    list of them, each message checked and its content made text: a string, None, or
    OpenAI's content parts, whose text parts are joined (as the server's chat
    completions; a list reached the template as its Python repr)."""
    bad = InvalidRequestError("messages must be a list of {'role', 'content'} dicts, or a "
                              "list of such lists (one per conversation)")
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence) \
            or not messages:
        raise bad
    batch = [messages] if isinstance(messages[0], dict) else list(messages)
    for conversation in batch:
        if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence) \
                or not conversation or not all(isinstance(m, dict) and "role" in m
                                               for m in conversation):
            raise bad
    return [[_message(m) for m in conversation] for conversation in batch]


def _message(m: dict) -> dict:
    if m["role"] not in ROLES:
        raise InvalidRequestError(f"message role must be one of {', '.join(ROLES)}, got "
                                  f"{m['role']!r}")
    content = m.get("content")
    if isinstance(content, list):
        kinds = [p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content]
        other = next((k for k in kinds if k != "text"), None)
        if other is not None or not all(isinstance(p.get("text"), str) for p in content):
            raise InvalidRequestError(f"message content parts must be {{'type': 'text', "
                                      f"'text': str}} (this engine reads text only), got "
                                      f"{other or 'a text part without text'!r}")
        return {**m, "content": join_parts(p["text"] for p in content)}
    if content is not None and not isinstance(content, str):
        raise InvalidRequestError(f"message content must be a string, a list of text parts "
                                  f"or None, got {type(content).__name__}")
    return m


def join_parts(texts) -> str:
    """A message's text parts as the template gets them: one per line, as vLLM joins a
    content list for a template that reads a string (they ran together before
    2026-11-29: "What news" + "from the court?" read "What newsfrom the court?"; the
    server and LLM.chat both join here)."""
    return "\n".join(texts)


def pick_template(tokenizer, override: str | None = None) -> str:
    return override or getattr(tokenizer, "chat_template", None) or PLAY_TEMPLATE


# chat_template_kwargs that are no template variable: the template is the server's, the
# conversation is `messages`, and the renderer returns text (vLLM refuses the first two)
RESERVED_KWARGS = ("chat_template", "tokenize", "messages")


def check_template_kwargs(kwargs) -> dict:
    """vLLM's chat_template_kwargs: a dict of extra template variables (enable_thinking,
    say); InvalidRequestError for another type or a RESERVED_KWARGS key."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidRequestError("chat_template_kwargs must be an object of template "
                                  "variables")
    if reserved := [k for k in RESERVED_KWARGS if k in kwargs]:
        raise InvalidRequestError(f"chat_template_kwargs cannot set {', '.join(reserved)} "
                                  "(the server's template renders the messages to text)")
    return kwargs


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The variables `template` reads and does not set itself (jinja2.meta): what
    chat_template_kwargs can give it; empty when jinja cannot parse it here (an
    extension tag), so that nothing reaches the renderer's own arguments."""
    import jinja2
    import jinja2.meta
    from jinja2.ext import loopcontrols
    try:
        ast = jinja2.Environment(extensions=[loopcontrols]).parse(template)
    except jinja2.TemplateError:
        return frozenset()
    return frozenset(jinja2.meta.find_undeclared_variables(ast))


def render(tokenizer, template: str, messages: list[dict],
           add_generation_prompt: bool = True,
           tools: list[dict] | None = None,
           template_kwargs: dict | None = None,
           continue_final_message: bool = False) -> tuple[str, list[int]]:
    """The prompt text and its token ids (no extra special tokens: the template has them);
    `tools` go to templates that show them (the play template does not).
    `template_kwargs` (vLLM's chat_template_kwargs, check_template_kwargs) are set over
    these as template variables, those the template reads (others are dropped, as vLLM
    does). `continue_final_message` (vLLM's, with add_generation_prompt false): the text
    ends with the last message's content, which the model then continues (whatever the
    template writes after it is cut, as transformers cuts it). A template error is an
    InvalidRequestError (the messages', or the template's, fault)."""
    if continue_final_message and add_generation_prompt:
        raise InvalidRequestError("continue_final_message and add_generation_prompt cannot "
                                  "both be true (the model either continues the last "
                                  "message or starts a new one)")
    used = template_variables(template)
    variables = {"add_generation_prompt": add_generation_prompt, "tools": tools,
                 **{k: v for k, v in check_template_kwargs(template_kwargs).items()
                    if k in used}}
    tools = variables["tools"]
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequestError(f"tools must be a list of tool dicts, got "
                                  f"{type(tools).__name__}")
    try:
        if template == PLAY_TEMPLATE:
            text = _play().render(messages=messages, **{"documents": None, **variables})
        else:
            text = tokenizer.apply_chat_template(messages, chat_template=template,
                                                 tokenize=False, **variables)
    except Exception as exc:
        raise InvalidRequestError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    if continue_final_message:
        text = _up_to_final(text, messages[-1].get("content"))
    check_text("messages", text)      # a lone surrogate fails in the tokenizer: refused here
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def _up_to_final(text: str, final) -> str:
    """`text` cut after the last message's content, as transformers' apply_chat_template
    cuts it: found stripped, its trailing spaces kept where the template kept them."""
    final = final or ""
    core = final.strip()
    if not core or core not in text:
        raise InvalidRequestError("continue_final_message: the last message has no text "
                                  "that the rendered prompt shows")
    at = text.rindex(core)
    whole = len(final.lstrip())
    return text[:at + whole] if text[at:at + whole] == final else text[:at + len(core)]


@functools.cache
def _play():
    """PLAY_TEMPLATE compiled in the environment transformers renders chat templates in
    (a sandbox with trim_blocks, lstrip_blocks and loop controls; `tojson` without HTML
    escaping, raise_exception, strftime_now), by jinja2 itself: the play template, which
    a model without its own template gets, then needs no transformers. Importing it cost
    the first chat request of `roseplay serve` on the bundled model ~5 s on a 2-core box;
    tests/roseplay/serve/test_chat_render.py holds the two renderings equal."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(PLAY_TEMPLATE)

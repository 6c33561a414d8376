"""Request -> engine inputs: prompt dicts (token ids + text) and per-choice SamplingParams.

Text is tokenized here with the engine's tokenizer (`tokenizer.encode`, as the engine
itself would), so the server knows every prompt's length: it fills in the default
max_tokens (the model's generation-config default, at most the rest of the context, as
vLLM's get_max_tokens) and refuses prompt + max_tokens over max_model_len with vLLM's
400 message instead of silently cutting the output. The
routes call these on a worker thread when the prompt is long or has many parts (a
tokenizer or template pass each), on the event loop when it is short (`on_loop`: the
thread hop costs more than the work); every 400 names its request field (`param`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import InvalidRequestError
from engine.validation import MAX_TOKENS, check_text, context_tokens
from roseplay.serve import chat
from roseplay.serve.errors import invalid
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from roseplay.serve.tools import message_dict


@dataclass(frozen=True)
class EngineInputs:
    prompts: list[dict]          # one per choice: {"prompt_token_ids", "prompt"}
    params: list                 # SamplingParams, one per choice
    prompt_lens: list[int]       # one per distinct prompt (usage counts each once)
    prompt_texts: list[str | None]


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's generation-config defaults (EngineInfo's; vLLM's serving classes'
    default_sampling_params and override_max_tokens): `params` fills the sampling fields
    a request leaves out (null), its max_tokens the output length of one that sets none
    (at most the rest of `context`: validation.context_tokens, as LLM's InputProcessor);
    override_max_tokens (a --generation-config folder's max_new_tokens) caps every
    request's."""
    params: dict = field(default_factory=dict)
    override_max_tokens: int | None = None
    context: int | None = None

    @classmethod
    def of(cls, info) -> "SamplingDefaults":
        return cls(dict(info.default_sampling_params), info.override_max_tokens,
                   context_tokens(info.max_model_len, info.num_blocks, info.block_size))


NO_DEFAULTS = SamplingDefaults()
MAX_CHOICES = 1024     # prompts x n of one request: each is an engine request
# at most this much prompt is turned into inputs on the event loop (about 0.4 ms of
# tokenizing, or of decoding token ids, on one core); more goes to a worker thread.
# Items (prompts, chat messages, content parts) count too: each costs a template pass or
# a tokenizer call whatever its length (120,000 empty messages took 6 s on the loop)
ON_LOOP_TEXT_CHARS = 1024
ON_LOOP_TOKEN_IDS = 2048
ON_LOOP_ITEMS = 16


def on_loop(req: SamplingFields) -> bool:
    """Whether the request's inputs are cheap enough to build on the event loop."""
    if isinstance(req, ChatCompletionRequest):
        return messages_on_loop(req.messages)
    return prompts_on_loop(req.prompt if isinstance(req.prompt, list) and req.prompt
                           and not isinstance(req.prompt[0], int) else [req.prompt])


def messages_on_loop(messages) -> bool:
    """A chat's messages: cheap enough to render and tokenize on the event loop."""
    items = len(messages) + sum(len(m.content) for m in messages
                                if isinstance(m.content, list))
    return items <= ON_LOOP_ITEMS and sum(len(m.text()) for m in messages) <= ON_LOOP_TEXT_CHARS


def prompts_on_loop(prompts) -> bool:
    """Prompts (texts or token-id lists): cheap enough to turn into inputs on the loop."""
    if len(prompts) > ON_LOOP_ITEMS:
        return False
    chars = sum(len(p) for p in prompts if isinstance(p, str))
    ids = sum(len(p) for p in prompts if not isinstance(p, str))
    return chars <= ON_LOOP_TEXT_CHARS and ids <= ON_LOOP_TOKEN_IDS


def check_vocab_ids(ids, vocab_size: int, param: str) -> None:
    """Token ids of a request field, each in the vocabulary (a 400 naming `param`)."""
    if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        raise invalid(f"token ids must be in [0, {vocab_size}); got min {min(ids)}, "
                      f"max {max(ids)}", param)


def completion_prompt(tokenizer, prompt, vocab_size: int, max_model_len: int,
                      keep: int | None = None, special: bool = True) -> dict:
    """keep: the prompt's last `keep` tokens only (vLLM's truncate_prompt_tokens);
    special: a text's encode adds the tokenizer's special tokens (BOS; vLLM's
    add_special_tokens, true by default on completions)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise invalid("this model has no tokenizer: send the prompt as token ids (a "
                          "list of integers), not text", "prompt")
        if not prompt:
            raise InvalidRequestError("prompt is empty")
        check_text("prompt", prompt)    # a lone surrogate fails in the tokenizer: a 400 here
        ids = tokenizer.encode(prompt, add_special_tokens=special)
        return truncated({"prompt_token_ids": list(ids), "prompt": prompt}, keep, tokenizer)
    check_vocab_ids(prompt, vocab_size, "prompt")      # before decoding them
    prompt = prompt[-keep:] if keep else prompt
    if len(prompt) >= max_model_len:         # before decoding a long list of them
        _max_tokens(1, len(prompt), max_model_len)
    text = tokenizer.decode(prompt) if tokenizer is not None else None
    return {"prompt_token_ids": list(prompt), "prompt": text}


def truncate_to(req: SamplingFields, max_model_len: int) -> int | None:
    """vLLM's truncate_prompt_tokens: how many of a prompt's last tokens to keep (-1: the
    context's length), or None."""
    keep = req.truncate_prompt_tokens
    if keep is not None and not (keep == -1 or 1 <= keep <= max_model_len):
        raise invalid(f"truncate_prompt_tokens must be -1 or in [1, {max_model_len}] (the "
                      f"context), got {keep}", "truncate_prompt_tokens")
    return max_model_len if keep == -1 else keep


def truncated(prompt: dict, keep: int | None, tokenizer) -> dict:
    """The prompt's last `keep` tokens, its text decoded from them (what echo shows)."""
    ids = prompt["prompt_token_ids"]
    if not keep or len(ids) <= keep:
        return prompt
    return {"prompt_token_ids": ids[-keep:], "prompt": tokenizer.decode(ids[-keep:])}


def _max_tokens(requested: int | None, prompt_len: int, max_model_len: int,
                field: str = "max_tokens", prompt_field: str = "prompt",
                defaults: SamplingDefaults = NO_DEFAULTS) -> int:
    """The output's length; a 400 names `field`, the request field it came from (chat's
    max_completion_tokens or max_tokens), or `prompt_field` when the prompt alone fills
    the context. None: the default's max_tokens, at most the rest of the context (of the
    KV pool where it holds fewer tokens: more could never be served)."""
    if requested is None:
        context = defaults.context or max_model_len
        rest = max(1, context - prompt_len)
        requested = min(rest, defaults.params.get("max_tokens", rest))
    if not 1 <= requested <= MAX_TOKENS:
        raise invalid(f"{field} must be an integer in [1, {MAX_TOKENS}], got {requested}", field)
    if prompt_len + requested > max_model_len:
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} in the completion). Please reduce the prompt or {field}.",
            field if prompt_len < max_model_len else prompt_field)
    cap = defaults.override_max_tokens
    return requested if cap is None else min(requested, cap)


def _expand(req: SamplingFields, prompts: list[dict], requested: int | None,
            max_model_len: int, field: str = "max_tokens",
            defaults: SamplingDefaults = NO_DEFAULTS) -> EngineInputs:
    """n choices per prompt (best_of candidates: the routes keep the n best): choice
    index = prompt_index * n + i (OpenAI's order)."""
    all_prompts, params, bias = [], [], req.logit_bias_ids()
    for p in prompts:
        n_prompt = len(p["prompt_token_ids"])
        if n_prompt == 0:
            raise InvalidRequestError("prompt is empty (0 tokens)")
        max_tokens = _max_tokens(requested, n_prompt, max_model_len, field, req.PROMPT_FIELD,
                                 defaults)
        for i in range(req.num_candidates):
            all_prompts.append(p)
            params.append(req.sampling_params(max_tokens, i, bias, defaults.params))
    return EngineInputs(all_prompts, params, [len(p["prompt_token_ids"]) for p in prompts],
                        [p.get("prompt") for p in prompts])


def completion_inputs(req: CompletionRequest, tokenizer, max_model_len: int,
                      vocab_size: int, defaults: SamplingDefaults = NO_DEFAULTS) -> EngineInputs:
    if len(req.prompts()) * req.num_candidates > MAX_CHOICES:   # before tokenizing them all
        raise invalid(f"{len(req.prompts())} prompts x n={req.num_candidates} choices; at "
                      f"most {MAX_CHOICES} per request", "n")
    if tokenizer is None and req.stop:     # (the engine's own 400 would name no field)
        raise invalid("this model has no tokenizer: stop strings can never match (use "
                      "stop_token_ids)", "stop")
    keep = truncate_to(req, max_model_len)
    prompts = [completion_prompt(tokenizer, p, vocab_size, max_model_len, keep,
                                 req.add_special_tokens) for p in req.prompts()]
    return _expand(req, prompts, 1 if req.echo_only else req.max_tokens, max_model_len,
                   defaults=defaults)


def chat_inputs(req: ChatCompletionRequest, tokenizer, template: str,
                max_model_len: int, defaults: SamplingDefaults = NO_DEFAULTS,
                template_defaults: dict | None = None,
                exclude_tools_none: bool = False) -> EngineInputs:
    """`template_defaults`: --default-chat-template-kwargs; `exclude_tools_none`:
    --exclude-tools-when-tool-choice-none."""
    messages = [message_dict(m) for m in req.messages]
    tools = req.tool_spec.for_template(exclude_tools_none) if req.tool_spec is not None \
        else None
    text, ids = chat.render(tokenizer, template, messages, req.add_generation_prompt, tools,
                            req.PROMPT_FIELD,
                            chat.with_defaults(template_defaults, req.template_kwargs),
                            req.continue_final_message)
    field = req.max_tokens_field
    prompt = truncated({"prompt_token_ids": ids, "prompt": text},
                       truncate_to(req, max_model_len), tokenizer)
    return _expand(req, [prompt], req.requested_max_tokens, max_model_len, field, defaults)

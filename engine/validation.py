"""The one validation layer at the engine's boundary: every client value gets a type and
a bound here, named with the accepted range in the message.

Why bounds and not just types: a value the engine accepts must survive every stage
after it (the msgpack codec of the engine address, numpy int64/int32 columns of the step
batch, torch generators). A value that passes here and overflows later fails inside a
step, where it costs the other requests of that step a re-run; one refused here fails
only its own submit. SamplingParams, InputProcessor and the engine-core process call
these functions; nothing else re-implements them.
"""
from __future__ import annotations

import functools
from typing import Annotated

import msgspec

from engine.errors import InvalidRequestError
from engine.ranges import MAX_SEED, MIN_SEED, check_int, check_number, check_priority, show

INT32_MAX = 2 ** 31 - 1
MAX_TOKENS = INT32_MAX            # a bound a numpy int32 column and msgpack both carry
MAX_TOP_K = INT32_MAX             # larger than any vocabulary: clamped to it when sampling
MAX_TEMPERATURE = 1e4             # flat beyond this; inf would turn every logit into NaN
MAX_STOP_STRINGS = 64             # each is searched after every token: bounded work per step
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_REQUEST_ID_CHARS = 256
# vLLM's sampling surface (docs/SAMPLING.md): OpenAI's ranges where OpenAI has one
MAX_PENALTY = 2.0                 # presence/frequency: OpenAI's [-2, 2]
# the sampler computes in float32: a bound keeps every in-range value meaningful there
MIN_TOP_P = 2.0 ** -126           # float32's smallest normal number: a smaller top_p is 0
#                                   (or a subnormal a GPU may flush to 0) and drops every token
MAX_REPETITION_PENALTY = 1e4      # vLLM: > 0; bounded so the logits stay finite: a logit
MIN_REPETITION_PENALTY = 1e-4     # is scaled by at most 1e4 either way (1e-40 made them inf)
MAX_LOGIT_BIAS = 100.0            # OpenAI: a bias in [-100, 100]
MAX_LOGIT_BIAS_ENTRIES = 1024     # each is a scatter entry of every step: bounded work
MAX_LOGPROBS = 20                 # vLLM's default max_logprobs; OpenAI's top_logprobs bound
MAX_N = 1024                      # sequences per prompt (SamplingParams.n): each is a request

__all__ = ["check_int", "check_number", "check_text", "check_request_id", "check_stop",
           "check_stop_token_ids", "check_priority", "INT32_MAX", "MAX_TOKENS", "MAX_TOP_K",
           "MAX_SEED", "MIN_SEED", "MAX_TEMPERATURE", "MAX_STOP_STRINGS", "MAX_STOP_CHARS",
           "MAX_STOP_TOKEN_IDS", "MAX_REQUEST_ID_CHARS", "check_prompt_ids", "MAX_PENALTY",
           "MAX_REPETITION_PENALTY", "MIN_REPETITION_PENALTY", "MIN_TOP_P", "MAX_LOGIT_BIAS",
           "MAX_LOGIT_BIAS_ENTRIES", "MAX_LOGPROBS", "MAX_N",
           "check_logit_bias", "check_logprobs", "check_bool", "check_top_p", "check_seed",
           "context_tokens"]


def context_tokens(max_model_len: int, num_blocks: int, block_size: int) -> int:
    """The most tokens one request can hold: the context, or the KV pool where it holds
    fewer (what max_tokens=None runs to, in LLM and the server alike)."""
    return min(max_model_len, num_blocks * block_size)


def check_seed(seed, samples: int = 1) -> int | None:
    """None, or a seed whose `samples` choices' seeds (choice i samples with seed + i:
    engine.request.sample_seed) all fit in [MIN_SEED, MAX_SEED]: SamplingParams with its
    n, the server with its n or best_of."""
    if seed is None:
        return None
    check_int("seed", seed, MIN_SEED, MAX_SEED)
    top = MAX_SEED - (samples - 1)
    if seed > top:
        raise InvalidRequestError(f"seed must be at most {top} with {samples} choices (choice i "
                                  f"samples with seed + i, at most {MAX_SEED}), got {seed}")
    return seed


def check_bool(name: str, value) -> bool:
    """A bool, as the wire decodes one (1 and "true" are not)."""
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be a boolean, got {show(value)}")
    return value


def check_top_p(value) -> float:
    """(0, 1], and not below float32's smallest normal number (MIN_TOP_P): the sampler's
    float32 copy of a smaller value is 0, which keeps no token (a NaN row, token 0)."""
    check_number("top_p", value, 0, 1, lo_open=True)
    if value < MIN_TOP_P:
        raise InvalidRequestError(f"top_p must be at least {MIN_TOP_P:.4g} (float32's smallest "
                                  f"normal number; the sampler computes in float32, where a "
                                  f"smaller top_p is 0 and keeps no token), got {show(value)}")
    return value


def check_text(name: str, value: str) -> str:
    """Text that UTF-8 can carry (a lone surrogate such as '\\ud800' cannot: it would fail
    in the tokenizer or the wire codec, far from the caller)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{name} is not valid Unicode (lone surrogate at "
                                  f"position {exc.start})") from None
    return value


def check_request_id(request_id) -> str:
    """A non-empty string of at most MAX_REQUEST_ID_CHARS characters, valid UTF-8."""
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestError(f"request_id must be a non-empty string of at most "
                                  f"{MAX_REQUEST_ID_CHARS} characters, got "
                                  f"{str(request_id)[:60]!r}")
    return check_text("request_id", request_id)


def check_stop(stop) -> tuple[str, ...]:
    """None, a string or a list of strings -> a tuple of non-empty, bounded strings."""
    strings = (stop,) if isinstance(stop, str) else stop
    if strings is None:
        return ()
    if isinstance(strings, (bytes, dict)) or not hasattr(strings, "__iter__"):
        raise InvalidRequestError("stop must be a non-empty string or list of them")
    strings = tuple(strings)
    if any(not isinstance(s, str) or not s for s in strings):
        raise InvalidRequestError("stop must be a non-empty string or list of them")
    if len(strings) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in strings):
        raise InvalidRequestError(f"stop: at most {MAX_STOP_STRINGS} strings of at most "
                                  f"{MAX_STOP_CHARS} characters (every one is matched "
                                  "after every token)")
    for s in strings:
        check_text("stop", s)
    return strings


def check_stop_token_ids(ids) -> tuple[int, ...]:
    """None or a list of token ids, each in [0, INT32_MAX]."""
    if ids is None:
        return ()
    if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__iter__"):
        raise InvalidRequestError("stop_token_ids must be a list of integers")
    ids = tuple(ids)
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequestError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} entries, "
                                  f"got {len(ids)}")
    for t in ids:
        check_int("stop_token_ids entry", t, 0, INT32_MAX)
    return ids


_INT = frozenset({int})


@functools.lru_cache(maxsize=8)
def _ids_type(vocab_size: int):
    return list[Annotated[int, msgspec.Meta(ge=0, lt=vocab_size)]]


def _plain_ids_in_vocab(ids, vocab_size: int) -> bool:
    """Every id a plain int in [0, vocab_size): one pass in C (msgspec), a third of the
    type pass plus min and max on a 512-id prompt (int subclasses pass, bool not, as in
    _check_ids); a prompt it refuses takes _check_ids, which names the fault."""
    try:
        msgspec.convert(ids, _ids_type(vocab_size))
    except (msgspec.ValidationError, TypeError):
        return False
    return True


def _check_ids(ids, vocab_size: int, typed: bool) -> None:
    # set(map(type, ...)) runs in C (~8x a generator per id on a 512-id prompt); only a
    # list with other types than int takes the exact check (int subclasses pass, bool not)
    if not typed and not set(map(type, ids)) <= _INT and \
            any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise InvalidRequestError("prompt_token_ids must be integers")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InvalidRequestError(f"token ids must be in [0, {vocab_size}); got "
                                  f"min {min(ids)}, max {max(ids)}")


def check_prompt_ids(ids: list[int], max_tokens: int, vocab_size: int, max_model_len: int,
                     kv_capacity: int, block_size: int, typed: bool = False,
                     logit_bias: dict[int, float] | None = None) -> None:
    """A token-id prompt the model can hold: in the vocabulary, under max_model_len, and
    (with max_tokens) within the KV pool. The front checks it; the engine process re-checks.
    typed: the ids were decoded into a list[int] field (msgspec rejects bools and other
    types there), so the per-token type check is skipped."""
    if not ids:
        raise InvalidRequestError("prompt is empty (0 tokens)")
    if typed or not _plain_ids_in_vocab(ids, vocab_size):
        _check_ids(ids, vocab_size, typed)
    if logit_bias and max(logit_bias) >= vocab_size:
        raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab_size}), got "
                                  f"{max(logit_bias)}")
    if len(ids) >= max_model_len:
        raise InvalidRequestError(f"prompt has {len(ids)} tokens; max_model_len is "
                                  f"{max_model_len} (prompt must leave room for 1 token)")
    need = min(len(ids) + max_tokens, max_model_len)
    if need > kv_capacity:
        raise InvalidRequestError(f"prompt + max_tokens = {need} tokens can never fit the "
                                  f"KV pool ({kv_capacity // block_size} blocks x {block_size} "
                                  f"= {kv_capacity} tokens)")


def check_logit_bias(bias) -> dict[int, float] | None:
    """None or {token id: bias in [-100, 100]} (ids checked against the vocabulary by the
    InputProcessor, which knows it); an empty dict is None."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise InvalidRequestError("logit_bias must be a map of token id -> bias")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequestError(f"logit_bias: at most {MAX_LOGIT_BIAS_ENTRIES} entries, "
                                  f"got {len(bias)}")
    for token, value in bias.items():
        check_int("logit_bias token id", token, 0, INT32_MAX)
        check_number("logit_bias value", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return dict(bias) or None


def check_logprobs(name: str, value) -> int | None:
    """None, or how many top logprobs per token: [0, MAX_LOGPROBS]."""
    return None if value is None else check_int(name, value, 0, MAX_LOGPROBS)

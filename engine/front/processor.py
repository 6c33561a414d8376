"""The front's text handling: prompts in (tokenize, validate), tokens out (detokenize,
stop strings, stream events, final RequestOutputs).

This runs in the front, never inside the engine core (whose step sees token ids only):
in EngineClient (on its transport's thread: the IO thread with the core in its own
process, the engine thread with the core in process) or in LLM's caller. It reads the
core's own StepOutput, as the engine sent it. Stop strings are matched here, on the
detokenized text; a hit ends the
request for its consumer at once and the front tells the core to abort it (the core
may have computed one more token by then, which is dropped, as in vLLM V1).
"""
from __future__ import annotations

import itertools
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

from engine.codes import REASON_STOP
from engine.config import InvalidRequestError, check_priority
from engine.front.detokenizer import decode, make_detokenizer
from engine.grammars import check_grammar
from engine.outputs import CoreRequest, EngineInfo, FinishedRequest, StepOutput
from engine.request import SamplingParams
from engine.request_output import CompletionOutput, RequestMetrics, RequestOutput
from engine.validation import (MAX_TOKENS, check_prompt_ids, check_request_id, check_text,
                               context_tokens)


# default request ids: unique across the processes attached to one engine, which refuses
# an id live for another client (each process counting from the same first id collided)
_ID_TAG = secrets.token_hex(4)
_REQUEST_IDS = itertools.count()


def default_request_id() -> str:
    return f"req-{_ID_TAG}-{next(_REQUEST_IDS)}"


@dataclass(frozen=True)
class StreamEvent:
    """What one step added to a request: new tokens (with emit times) and text."""
    request_id: str
    token_ids: tuple[int, ...]
    token_times: tuple[float, ...]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    output: RequestOutput | None = None     # the whole result, on the final event
    logprobs: tuple | None = None           # TokenLogprobs per token (params.logprobs set)
    prompt_logprobs: tuple | None = None    # the prompt's (params.prompt_logprobs), once


PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids"})   # vLLM's TextPrompt / TokensPrompt


class InputProcessor:
    """Prompt (text, token ids, {"prompt": text} or {"prompt_token_ids", "prompt"}: vLLM's
    TextPrompt and TokensPrompt) -> validated CoreRequest."""

    def __init__(self, tokenizer, model_name: str, vocab_size: int, max_model_len: int,
                 num_blocks: int, block_size: int, grammar_backend: str = "auto"):
        self.tokenizer = tokenizer
        self.grammar_backend = grammar_backend     # whose library reads constraints
        self.model_name = model_name
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_blocks, self.block_size = num_blocks, block_size

    @classmethod
    def of(cls, tokenizer, info: EngineInfo) -> "InputProcessor":
        """For the engine that `info` describes (what every transport's front knows)."""
        return cls(tokenizer, info.model_name, info.vocab_size, info.max_model_len,
                   info.num_blocks, info.block_size, info.structured_outputs_backend)

    def process(self, prompt, params: SamplingParams | None = None,
                request_id: str | None = None, priority: int = 0
                ) -> tuple[CoreRequest, str | None]:
        """Returns the core request and the prompt text (None for token-id prompts)."""
        arrival = time.perf_counter()
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        if params.n != 1:
            raise InvalidRequestError(f"n={params.n}: a request runs one sequence (LLM.generate "
                                      "fans n out; here submit n requests)")
        text, ids = self._tokenize(prompt)
        if params.max_tokens is None:   # vLLM's None: the rest of the context, which is
            #                             the pool's room where the pool holds less
            context = context_tokens(self.max_model_len, self.num_blocks, self.block_size)
            params = params.replace(max_tokens=min(MAX_TOKENS, max(1, context - len(ids))))
        self.validate_ids(ids, params)
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError(f"model {self.model_name!r} has no tokenizer: stop strings "
                                      "can never match (use stop_token_ids)")
        # a constraint its library cannot read is refused here, as vLLM's processor does
        check_grammar(params.structured_outputs, self.grammar_backend)
        rid = check_request_id(request_id) if request_id is not None \
            else default_request_id()
        preview = text[:80] if text is not None else None
        return CoreRequest(rid, tuple(ids), params, arrival, preview,
                           check_priority(priority)), text

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            other = sorted(map(str, set(prompt) - PROMPT_KEYS))
            if other:        # vLLM's multi_modal_data, cache_salt, ...: not honoured here
                raise InvalidRequestError(f"a dict prompt's {other[0]!r} is not supported by "
                                          "this engine (a dict prompt takes 'prompt' and "
                                          "'prompt_token_ids')")
            if "prompt_token_ids" not in prompt:       # vLLM's TextPrompt: {"prompt": text}
                text = prompt.get("prompt")
                if not isinstance(text, str):
                    raise InvalidRequestError("a dict prompt needs 'prompt_token_ids' (a list "
                                              "of integers) or 'prompt' (a string)")
                return self._tokenize(text)
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise InvalidRequestError("prompt_token_ids must be a list of integers, got "
                                          f"{type(ids).__name__}")
            text = prompt.get("prompt")
            if text is not None and not isinstance(text, str):
                raise InvalidRequestError(f"a dict prompt's 'prompt' must be a string, got "
                                          f"{type(text).__name__}")
            return text and check_text("prompt", text), list(ids)
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string or token ids, got {type(prompt).__name__}")
        if not prompt:
            raise InvalidRequestError("prompt is empty")
        if self.tokenizer is None:
            raise InvalidRequestError(f"model {self.model_name!r} has no tokenizer: pass "
                                      "{'prompt_token_ids': [...]} instead of text")
        return prompt, self.tokenizer.encode(check_text("prompt", prompt))

    def validate_ids(self, ids: list[int], params: SamplingParams, typed: bool = False) -> None:
        check_prompt_ids(ids, params.max_tokens, self.vocab_size, self.max_model_len,
                         self.num_blocks * self.block_size, self.block_size, typed,
                         params.logit_bias)


@dataclass
class RequestState:
    """The front's view of one request: its output so far and where its events go."""
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    on_event: Callable[[StreamEvent], None] | None    # token stream (None: finish only)
    on_finish: Callable[[StreamEvent], None] | None
    detok: object | None           # engine/front/detokenizer.py: step(output_ids, text)
    output_ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    text: str = ""
    text_before_last: int = 0      # len(text) before the last token's (a stop token's
    #                                text is dropped, as vLLM's: _stop_token_text)
    sent_tokens: int = 0
    sent_text: int = 0
    stop_string: str | None = None   # the stop string that matched: it ended here, the
    #                                  core aborts it
    hold: int = 0                  # a stream holds back this many characters: the longest
    #                                stop string's less one (vLLM's stop buffer)
    logprobs: list | None = None   # TokenLogprobs per output token (params.logprobs set)
    held_stop: tuple = ()          # stop strings matched only once output > min_tokens
    prompt_logprobs: tuple | None = None   # params.prompt_logprobs: entry 0 None (vLLM)
    sent_prompt_logprobs: bool = False


class OutputProcessor:
    """StepOutputs -> per-request state -> StreamEvents to each request's sinks."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add(self, creq: CoreRequest, prompt_text: str | None,
            on_event: Callable[[StreamEvent], None] | None,
            on_finish: Callable[[StreamEvent], None] | None) -> None:
        """Register a request's sinks: `on_event` gets every step's delta (and the final
        event); `on_finish` gets the final event only. No event is built for nobody."""
        p = creq.params
        # text is decoded incrementally only when someone reads it per step or it is
        # needed for stop strings; otherwise once, at the end
        detok = (make_detokenizer(self.tokenizer, p.stop, p.skip_special_tokens,
                                  p.include_stop_str_in_output,
                                  p.spaces_between_special_tokens)
                 if self.tokenizer is not None and p.detokenize
                 and (p.stop or on_event is not None) else None)
        st = self.states[creq.request_id] = RequestState(
            creq.request_id, prompt_text, creq.prompt_token_ids, p, on_event, on_finish, detok)
        if p.logprobs is not None:
            st.logprobs = []
        if p.stop and not p.include_stop_str_in_output:   # (kept text is never cut)
            st.hold = max(map(len, p.stop)) - 1
        if p.min_tokens and p.stop and detok is not None:   # vLLM: no stop string before
            st.held_stop, detok.stop = p.stop, ()           # min_tokens output tokens

    def has(self, request_id: str) -> bool:
        return request_id in self.states

    def process(self, out: StepOutput) -> list[str]:
        """Apply one step; returns the ids the core must abort (stop strings matched:
        their final event comes with the core's FinishedRequest, reason "stop")."""
        states, now, aborts, touched = self.states, out.time, [], {}
        logprobs = out.logprobs
        for rid, lps in (out.prompt_logprobs or {}).items():
            if (st := states.get(rid)) is not None:   # before its first token (same step)
                st.prompt_logprobs = tuple(lps)
                if st.on_event is not None:
                    touched[rid] = st
        for rid, token, lp in zip(out.request_ids, out.token_ids,
                                  itertools.repeat(None) if logprobs is None else logprobs):
            st = states.get(rid)
            if st is None or st.stop_string is not None:
                continue
            st.output_ids.append(token)
            st.times.append(now)
            if st.logprobs is not None:
                st.logprobs.append(lp)
            if st.held_stop and len(st.output_ids) > st.params.min_tokens:
                st.detok.stop, st.held_stop = st.held_stop, ()
            if st.detok is not None:
                st.text_before_last = len(st.text)
                st.text, hit = st.detok.step(st.output_ids, st.text)
                if hit is not None:
                    st.stop_string = hit
                    aborts.append(rid)
            if st.on_event is not None:
                touched[rid] = st
        for fin in out.finished:
            st = states.get(fin.request_id)
            if st is not None:
                reason = REASON_STOP if st.stop_string is not None else fin.finish_reason
                self._finish(st, reason, fin.error, fin)
                touched.pop(fin.request_id, None)
        for st in touched.values():
            _call(st.on_event, self._delta(st, False, None, None, None))
        return aborts

    def fail(self, request_id: str, reason: str, error: str | None) -> None:
        """End a request the core never ran (refused at add, or the engine died)."""
        st = self.states.get(request_id)
        if st is not None:
            self._finish(st, reason, error, None)

    def fail_all(self, reason: str, error: str | None) -> None:
        for rid in list(self.states):
            self.fail(rid, reason, error)

    def _finish(self, st: RequestState, reason: str, error: str | None,
                fin: FinishedRequest | None) -> None:
        del self.states[st.request_id]
        self._deliver(st, reason, error, fin)

    def _deliver(self, st: RequestState, reason: str, error: str | None,
                 fin: FinishedRequest | None) -> None:
        p = st.params
        # vLLM: a stop token's text (EOS, a stop_token_ids id) is not in the output unless
        # include_stop_str_in_output (a stop string's is cut by the detokenizer)
        drop = int(reason == REASON_STOP and st.stop_string is None and bool(st.output_ids)
                   and not p.include_stop_str_in_output)
        if st.detok is None and self.tokenizer is not None and st.output_ids and p.detokenize:
            st.text = decode(self.tokenizer, st.output_ids[:len(st.output_ids) - drop],
                             p.skip_special_tokens, p.spaces_between_special_tokens)
        elif drop and st.detok is not None:     # (text already sent stays: never taken back)
            st.text = st.text[:max(st.text_before_last, st.sent_text)]
        arrival = fin.arrival_time if fin is not None else (st.times[0] if st.times else 0.0)
        metrics = RequestMetrics.from_times(arrival, st.times,
                                            fin.num_cached_tokens if fin else 0,
                                            fin.num_preemptions if fin else 0,
                                            fin.num_host_cached_tokens if fin else 0,
                                            fin.scheduled_ts if fin else None)
        lps = None if st.logprobs is None else tuple(st.logprobs)
        cumulative = None if lps is None else math.fsum(lp.logprobs[0] for lp in lps if lp)
        stop_reason = _stop_reason(st) if reason == REASON_STOP else None
        output = RequestOutput(st.request_id, st.prompt, st.prompt_token_ids,
                               (CompletionOutput(0, st.text, tuple(st.output_ids), reason, lps,
                                                 cumulative, stop_reason),),
                               True, metrics, error, st.prompt_logprobs,
                               fin.trace if fin is not None else None)
        event = self._delta(st, True, reason, error, output)
        _call(st.on_event, event)
        _call(st.on_finish, event)

    @staticmethod
    def _delta(st: RequestState, finished: bool, reason: str | None, error: str | None,
               output: RequestOutput | None) -> StreamEvent:
        n_tok, n_text = st.sent_tokens, st.sent_text
        # a stream holds back what may be the start of a stop string (vLLM's stop buffer):
        # text sent is never taken back when a later token completes the stop string
        end = len(st.text) if finished else len(st.text) - st.hold
        event = StreamEvent(st.request_id, tuple(st.output_ids[n_tok:]), tuple(st.times[n_tok:]),
                            st.text[n_text:max(n_text, end)], finished, reason, error, output,
                            None if st.logprobs is None else tuple(st.logprobs[n_tok:]),
                            None if st.sent_prompt_logprobs else st.prompt_logprobs)
        st.sent_prompt_logprobs = st.prompt_logprobs is not None
        st.sent_tokens, st.sent_text = len(st.output_ids), max(n_text, end)
        return event


def _call(callback, event: StreamEvent) -> None:
    """Deliver to a consumer's sink; a consumer's bug must not stop the engine thread."""
    if callback is None:
        return
    try:
        callback(event)
    except Exception:
        pass


def _stop_reason(st: RequestState) -> int | str | None:
    """vLLM's stop_reason of a stopped request: the stop string that matched, else the
    stop_token_ids id that ended it; None for EOS (the model's own end token)."""
    if st.stop_string is not None:
        return st.stop_string
    last = st.output_ids[-1] if st.output_ids else None
    return last if last in (st.params.stop_token_ids or ()) else None

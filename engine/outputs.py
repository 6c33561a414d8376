"""What crosses the boundary between the front (tokenizer, streams) and the engine core.

Plain values only, so the same messages serve an in-process loop and an engine in
another process. The core never sees text it must process: a `CoreRequest` carries
token ids (the prompt text only as a display preview), and a `StepOutput` carries the
new token ids of one step, columnar (one entry per token, no object per request).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from engine.request import SamplingParams


@dataclass(frozen=True)
class CoreRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float                 # time.perf_counter() when the client submitted it
    prompt_preview: str | None = None   # display only (snapshots); the core never reads it
    priority: int = 0                   # scheduling_policy=priority: lower first (vLLM)


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    finish_reason: str                  # engine.codes REASON_*
    error: str | None
    arrival_time: float                 # on the engine's serving clock (engine/core/clock.py)
    num_cached_tokens: int
    num_preemptions: int
    num_host_cached_tokens: int = 0     # those of the cached tokens from the host tier


class TokenLogprobs(msgspec.Struct, array_like=True, frozen=True):
    """One output token's logprobs, vLLM's layout: entry 0 is the sampled token, then
    the top-n (the sampled one may appear twice); rank: the sampled token's, 1 = best."""
    token_ids: list[int]
    logprobs: list[float]
    rank: int
    raw: "TokenLogprobs | None" = None   # SamplingParams.raw_logprobs: the same from the
    #                                     model's own log-softmax, before any processing


@dataclass
class StepOutput:
    """One step's results: new tokens (parallel lists) and the requests that ended."""
    time: float = 0.0                   # serving-clock time the step's tokens were emitted
    request_ids: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] | None = None   # parallel to token_ids, or None
    #                                     when no token of the step has any (the usual case)
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] | None = None   # request id ->
    #                          its prompt's, sent once with the step completing the prompt

    def align_logprobs(self, copy, requests: list) -> list:
        """The logprobs of a launched step's rows (None each where not asked; `copy`: its
        LogprobsCopy or None), with `logprobs` started (None for the tokens already in)."""
        if self.logprobs is None:
            self.logprobs = [None] * len(self.token_ids)
        return copy.per_row(requests) if copy is not None else [None] * len(requests)

    def __bool__(self) -> bool:
        return bool(self.request_ids or self.finished)


class EngineInfo(msgspec.Struct, frozen=True):
    """What a client needs to know about the engine it talks to (fixed at start). The
    same fields on both transports: EngineLoop builds it from its engine, the engine
    process sends it in its Welcome (engine/ipc/protocol.py)."""
    model_name: str
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    device: str
    dtype: str
    backend: str
    logprobs_mode: str = "processed_logprobs"   # what requests' logprobs hold (viewers say it)

    @classmethod
    def of(cls, e) -> "EngineInfo":
        return cls(e.model_name, e.vocab_size, e.max_model_len, e.pool.num_blocks,
                   e.pool.block_size, str(e.device), str(e.dtype).removeprefix("torch."),
                   e.backend, e.config.logprobs_mode)

"""What crosses the boundary between the front (tokenizer, streams) and the engine core.

msgspec Structs, sent as they are by both transports: handed over on a thread of this
process (engine/ipc/inproc.py) or encoded once onto the engine process's sockets
(engine/ipc/protocol.py), with no copy or translation on either side. The core never
sees text it must process: a `CoreRequest` carries token ids (the prompt text only as a
display preview), and a `StepOutput` carries the new token ids of one step, columnar
(one entry per token, no object per request). The controls beside them are
engine/commands.py's.
"""
from __future__ import annotations

import msgspec

from engine.request import SamplingParams


class CoreRequest(msgspec.Struct, tag=True, frozen=True):
    """A validated request (engine/front/processor.py InputProcessor). Decoding one off
    the wire checks every field's type and SamplingParams' bounds (a refusal names the
    field: protocol.wire_error); the core checks the rest when it takes it."""
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float                 # time.perf_counter() when the client submitted it
    prompt_preview: str | None = None   # display only (snapshots); the core never reads it
    priority: int = 0                   # scheduling_policy=priority: lower first (vLLM)


class FinishedRequest(msgspec.Struct, array_like=True, frozen=True):
    request_id: str
    finish_reason: str                  # engine.codes REASON_*
    error: str | None
    arrival_time: float                 # on the engine's serving clock (engine/core/clock.py)
    num_cached_tokens: int
    num_preemptions: int
    num_host_cached_tokens: int = 0     # those of the cached tokens from the host tier


class TokenLogprobs(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One output token's logprobs, vLLM's layout: entry 0 is the sampled token, then
    the top-n (the sampled one may appear twice); rank: the sampled token's, 1 = best.
    Not tracked by the garbage collector (gc=False: it holds lists of numbers and
    another TokenLogprobs, never a cycle): a request's trace keeps one per token, and
    tracked they filled the young generation (docs/PERF.md 2026-11-29)."""
    token_ids: list[int]
    logprobs: list[float]
    rank: int
    raw: "TokenLogprobs | None" = None   # SamplingParams.raw_logprobs: the same from the
    #                                     model's own log-softmax, before any processing


class StepOutput(msgspec.Struct, tag=True, omit_defaults=True):
    """One step's results: new tokens (parallel lists) and the requests that ended. The
    engine process sends each client the part of it that holds its requests."""
    time: float = 0.0                   # serving-clock time the step's tokens were emitted
    request_ids: list[str] = []
    token_ids: list[int] = []
    finished: list[FinishedRequest] = []
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
    same fields on both transports: the in-process one builds it from its engine, the
    engine process sends it in its Welcome (engine/ipc/protocol.py)."""
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

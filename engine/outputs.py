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

from dataclasses import dataclass
from typing import NamedTuple

import msgspec
import numpy as np

from engine.generation_config import GENERATION_CONFIG_MODES
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
    trace: TokenTrace | None = None     # SamplingParams.token_trace: its token trace
    scheduled_ts: float | None = None   # first scheduled (serving clock; vLLM's
    #                                     RequestStateStats.scheduled_ts: a preemption
    #                                     does not move it); None: never scheduled


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

    # -- vLLM's view of an entry, dict[token id, Logprob] (what its scripts read:
    # lp[token_id].logprob, lp.items()): read-only, the sampled token first, a top-n
    # entry's rank its place (the sampled token's own rank where it is one of them)
    def as_dict(self) -> dict[int, "Logprob"]:
        out: dict[int, Logprob] = {}
        for i, (token, value) in enumerate(zip(self.token_ids, self.logprobs)):
            if token not in out:
                out[token] = Logprob(value, self.rank if i == 0 else i)
        return out

    def __getitem__(self, token_id: int) -> "Logprob":
        return self.as_dict()[token_id]

    def get(self, token_id: int, default=None):
        return self.as_dict().get(token_id, default)

    def __contains__(self, token_id) -> bool:
        return token_id in self.token_ids

    def __iter__(self):
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __bool__(self) -> bool:        # (not its length: an entry is always there)
        return True

    def keys(self):
        return self.as_dict().keys()

    def values(self):
        return self.as_dict().values()

    def items(self):
        return self.as_dict().items()


class Logprob(NamedTuple):
    """vLLM's Logprob: a token's logprob and rank (1 = the best); decoded_token stays None
    (the output's text is decoded once, by the front)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# a traced token's origin (TokenTrace.origin's low 2 bits; the drafts its verify checked
# sit above them): sampled by the target in a step without drafts for it, a draft the
# target accepted, the target's token after every draft of its verify was accepted (the
# bonus), or in place of the first rejected draft (the correction)
TOKEN_PLAIN, TOKEN_DRAFT, TOKEN_BONUS, TOKEN_CORRECTION = 0, 1, 2, 3


@dataclass(frozen=True)
class TokenTrace:
    """A finished request's output token by token (the TUI's token scrub), for its first
    `len(self)` tokens (engine/request.py TRACE_TOKENS): ids, emission times, speculative
    origin, and the logprobs it asked for: `top` entries a token (the sampled one, then
    the top-n), processed and, with raw_logprobs, the model's own. Packed little-endian
    arrays, so a snapshot carries a trace at the cost of a copy (engine/core/token_trace.py
    packs them)."""
    request_id: str
    num_tokens: int          # output tokens in all (the trace may keep fewer)
    token_ids: bytes         # int32 a token
    times: bytes             # float64 a token: its emission time (serving clock)
    origin: bytes            # uint8 a token: TOKEN_* | drafts of its verify << 2
    top: int = 0             # logprobs entries a token; 0: it asked for none
    logprobs: bytes = b""    # int32 ids [n, top], float64 values [n, top], int32 ranks [n]
    raw_logprobs: bytes = b""   # the same from the model's own log-softmax (or empty)

    def __len__(self) -> int:
        return len(self.origin)

    def ids(self) -> np.ndarray:
        return np.frombuffer(self.token_ids, "<i4")

    def token_times(self) -> np.ndarray:
        return np.frombuffer(self.times, "<f8")

    def origins(self) -> tuple[np.ndarray, np.ndarray]:
        """(TOKEN_* of each token, drafts of its verify: 0 for a plain token)."""
        codes = np.frombuffer(self.origin, np.uint8)
        return codes & 3, codes >> 2

    def sampled_probs(self) -> np.ndarray:
        """Each token's own probability (exp of entry 0's logprob: the sampled token,
        in the request's logprobs mode); empty without logprobs."""
        n = len(self)
        if not self.logprobs or not self.top:
            return np.zeros(0)
        values = np.frombuffer(self.logprobs, "<f8", n * self.top, 4 * n * self.top)
        return np.exp(values.reshape(n, self.top)[:, 0])

    def logprobs_at(self, i: int) -> TokenLogprobs | None:
        """Token i's logprobs (None: it asked for none), its raw ones inside."""
        lp = _unpack_logprobs(self.logprobs, len(self), self.top, i)
        if lp is not None and self.raw_logprobs:
            raw = _unpack_logprobs(self.raw_logprobs, len(self), self.top, i)
            lp = TokenLogprobs(lp.token_ids, lp.logprobs, lp.rank, raw)
        return lp


def _unpack_logprobs(data: bytes, n: int, top: int, i: int) -> TokenLogprobs | None:
    if not data or not top or not 0 <= i < n:
        return None
    ids = np.frombuffer(data, "<i4", n * top).reshape(n, top)[i]
    values = np.frombuffer(data, "<f8", n * top, 4 * n * top).reshape(n, top)[i]
    rank = int(np.frombuffer(data, "<i4", n, 12 * n * top)[i])
    if rank < 0:                        # this token has none (raw: not asked for it)
        return None
    keep = ids >= 0                     # a shorter entry's padding
    return TokenLogprobs(ids[keep].tolist(), values[keep].tolist(), rank)


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
    structured_outputs_backend: str = "auto"    # the grammar library the front checks
    #                                             constraints with (engine/grammars.py)
    # the model's generation-config defaults (EngineConfig.generation_config): what a
    # request of the server, or LLM.generate without SamplingParams, leaves out gets
    default_sampling_params: dict[str, int | float] = {}
    override_max_tokens: int | None = None      # a folder's max_tokens: every request's cap

    @classmethod
    def of(cls, e) -> "EngineInfo":
        defaults = e.executor.default_sampling_params
        from_folder = e.config.generation_config not in GENERATION_CONFIG_MODES
        return cls(e.model_name, e.vocab_size, e.max_model_len, e.pool.num_blocks,
                   e.pool.block_size, str(e.device), str(e.dtype).removeprefix("torch."),
                   e.backend, e.config.logprobs_mode,
                   e.config.structured_outputs_config.backend, defaults,
                   defaults.get("max_tokens") if from_folder else None)

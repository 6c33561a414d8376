"""What LLM.generate and the streams hand back for a request (vLLM's vllm/outputs.py):
RequestOutput with its CompletionOutput, and RequestMetrics, its latencies from the
token times. Built by the front (engine/front/processor.py, stream.py) from the core's
step outputs."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from operator import sub

from engine.metrics import request_latencies
from engine.outputs import TokenTrace


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None
    last_token_time: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    token_times: tuple[float, ...]       # each output token's time
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_host_cached_tokens: int = 0     # of num_cached_tokens: reloaded from the host tier
    first_scheduled_time: float | None = None   # vLLM's: its first scheduling (a
    #                                  preemption does not move it); None: never scheduled

    # -- vLLM's request phases (FinishedRequestStats), None where a phase did not happen:
    # queued = first scheduled - arrival, prefill = first token - first scheduled,
    # inference = last token - first scheduled, decode = last token - first token
    @property
    def queued_time(self) -> float | None:
        s = self.first_scheduled_time
        return None if s is None else s - self.arrival_time

    @property
    def prefill_time(self) -> float | None:
        s, t = self.first_scheduled_time, self.first_token_time
        return None if s is None or t is None else t - s

    @property
    def inference_time(self) -> float | None:
        s, t = self.first_scheduled_time, self.last_token_time
        return None if s is None or t is None else t - s

    @property
    def decode_time(self) -> float | None:
        t = self.first_token_time
        return None if t is None else self.last_token_time - t

    @property
    def itls(self) -> tuple[float, ...]:
        """The inter-token gaps, made when read: a finishing request builds its metrics
        on the engine's thread, where 127 gaps as floats were a tenth of its cost."""
        times = self.token_times
        return tuple(map(sub, islice(times, 1, None), times))

    @classmethod
    def from_times(cls, arrival: float, times: list[float], cached: int = 0,
                   preemptions: int = 0, host_cached: int = 0,
                   scheduled: float | None = None) -> "RequestMetrics":
        if not times:
            return cls(arrival, None, None, None, None, None, (), cached, preemptions,
                       host_cached, scheduled)
        ttft, tpot, _ = request_latencies(arrival, times)
        return cls(arrival, times[0], times[-1], ttft, tpot, times[-1] - arrival,
                   tuple(times), cached, preemptions, host_cached, scheduled)


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    logprobs: tuple | None = None        # TokenLogprobs per token (params.logprobs set)
    cumulative_logprob: float | None = None   # sum of the sampled tokens' logprobs
    stop_reason: int | str | None = None   # vLLM's: the stop string or stop_token_ids id
    #                                        that ended it; None for EOS, a length or no stop

    def finished(self) -> bool:
        """vLLM's CompletionOutput.finished(): it has a finish reason."""
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None
    prompt_logprobs: tuple | None = None   # params.prompt_logprobs: entry 0 None (vLLM)
    trace: TokenTrace | None = None        # params.token_trace: engine/outputs.py TokenTrace

    @property
    def num_cached_tokens(self) -> int:
        """vLLM's RequestOutput.num_cached_tokens: prompt tokens the prefix cache served."""
        return self.metrics.num_cached_tokens

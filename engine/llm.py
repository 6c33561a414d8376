"""The vLLM-like offline API: LLM(model=...).generate(prompts, sampling_params)."""
from __future__ import annotations

from typing import Callable, Sequence

from engine.config import EngineConfig, InvalidRequestError, make_config
from engine.core import LLMEngine
from engine.request import RequestOutput, SamplingParams


class LLM:
    """Offline batched generation. Keyword arguments are the knobs of engine.config
    (model, device, dtype, block_size, num_blocks / num_gpu_blocks,
    gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
    max_model_len, enforce_eager, attention_backend, seed, check_invariants)."""

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **kwargs):
        if config is None:
            if model is not None:
                kwargs["model"] = model
            config = make_config(**kwargs)
        self.engine = LLMEngine(config)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_step: Callable[[LLMEngine], None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt is a string, a list of token ids, or {"prompt_token_ids": [...]}.
        `on_step` (optional) is called after every engine step (tests, progress bars).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            if isinstance(sampling_params, dict) or not hasattr(sampling_params, "__iter__"):
                raise InvalidRequestError("sampling_params must be a SamplingParams or a list of "
                                          f"them, got {type(sampling_params).__name__}")
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequestError(f"sampling_params has {len(params)} entries for "
                                          f"{len(prompts)} prompts: pass one, or one per prompt")
        reqs = [self.engine.make_request(p, sp) for p, sp in zip(prompts, params)]
        for req in reqs:
            self.engine.add(req)
        while self.engine.has_unfinished():
            self.engine.step()
            if on_step is not None:
                on_step(self.engine)
        return [RequestOutput.from_request(r) for r in reqs]

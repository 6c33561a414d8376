"""The vLLM-like offline API: LLM(model=...).generate(prompts, sampling_params)."""
from __future__ import annotations

import dataclasses
import gc
from typing import Callable, Sequence

import torch

from engine.codes import REASON_CANCELLED, REASON_STOP
from engine.config import EngineConfig, InvalidRequestError, make_config
from engine.ipc.inproc import LLMEngine
from engine.front.chat_template import conversations, pick_template, render
from engine.front.processor import InputProcessor, OutputProcessor
from engine.outputs import EngineInfo
from engine.request import SamplingParams, sample_seed
from engine.request_output import RequestOutput
from engine.validation import check_bool


class LLM:
    """Offline batched generation. Keyword arguments are the knobs of engine.config
    (model, device, dtype, block_size, num_blocks / num_gpu_blocks_override,
    gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
    max_model_len, enforce_eager, attention_backend, seed, check_invariants).

    With data_parallel_size=N > 1 the engines run in N processes behind a router
    (docs/ROUTING.md): `generate()` works the same, `add_request` and `on_step` need one
    engine in this process. So does one engine with kv_events_config on: its process
    publishes the KV events on the config's endpoint, keyed by $ROSEPLAY_ENGINE_KEY
    (docs/ROUTING.md "KV events").

    `close()` (or `with LLM(...) as llm:`) releases the tensor-parallel workers, the
    process group, CUDA graphs, the weights and the KV cache, so that another LLM (any
    tensor-parallel size) can start in the same process (a notebook, a test).

    `proposer`: speculative drafts from this object instead of speculative_config's
    method (engine/core/spec_decode.py Proposer; docs/SPECULATIVE.md "Proposers"), with
    k from num_speculative_tokens; one engine in this process only.

    generate() and chat() without sampling_params (or with None for a prompt) use
    get_default_sampling_params(): the model's generation config
    (generation_config="auto", as vLLM's LLM), SamplingParams() with "vllm"."""

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None,
                 proposer=None, **kwargs):
        self.dp = None
        if config is not None and (model is not None or kwargs):   # they would be ignored
            named = ["model"] * (model is not None) + sorted(kwargs)
            raise InvalidRequestError(f"pass config or engine keywords, not both: got config "
                                      f"and {', '.join(named)}")
        given = config is not None
        if not given:
            if model is not None:
                kwargs["model"] = model
            config = make_config(**kwargs)
        own_process = config.needs_own_process()     # (its KV events: as vLLM's LLM)
        if own_process and (given or proposer is not None):
            raise InvalidRequestError(
                f"a proposer needs the engine in this process, without {own_process}"
                if not given
                else f"LLM(config=...) runs the engine in this process, without "
                     f"{own_process}: give the knobs as keywords, LLM(model=..., ...), to "
                     f"start engine processes")
        if own_process:      # engine processes behind a router (one replica or N)
            from engine.front.dp_client import DPClient
            self.engine, self.dp = None, DPClient(label="llm", snapshots=False, **kwargs)
            self.inputs, self.outputs = self.dp.inputs, None
            self._defaults = self.dp.info.default_sampling_params
            return
        self.engine = e = LLMEngine(config, proposer)
        info = EngineInfo.of(e)
        self.inputs = InputProcessor.of(e.tokenizer, info)
        self.outputs = OutputProcessor(e.tokenizer)
        self._defaults = info.default_sampling_params

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's LLM.get_default_sampling_params: SamplingParams with the model's
        generation-config defaults (EngineConfig.generation_config; docs/SAMPLING.md
        "Default sampling parameters"), the engine's own for the fields it leaves out."""
        return SamplingParams(**self._defaults)

    @property
    def tokenizer(self):
        return self.dp.tokenizer if self.dp is not None else self._engine().tokenizer

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's LLM.get_tokenizer); None for a model without one."""
        return self.tokenizer

    def close(self) -> None:
        """Release everything the engine holds; idempotent. The LLM is unusable after."""
        if self.dp is not None:
            self.dp.close()
            return
        engine, self.engine = self.engine, None
        if engine is None:
            return
        try:
            engine.close()               # its executor: graphs, workers and process group
        finally:
            self.inputs = self.outputs = None
            del engine
            gc.collect()                 # the model and KV cache go now, not at exit
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, in every replica (vLLM's LLM.reset_prefix_cache)."""
        self._check_open()
        if self.dp is not None:
            self.dp.reset_prefix_cache()
        else:
            self._engine().clear_prefix_cache()

    def _check_open(self) -> None:
        """RuntimeError once close() ran, wherever the engines run (a closed front's
        reset_prefix_cache did nothing)."""
        if (self.dp.closed if self.dp is not None else self.engine is None):
            raise RuntimeError("this LLM is closed")

    def _engine(self) -> LLMEngine:
        if self.engine is None:
            raise RuntimeError("this LLM is closed" if self.dp is None else
                               "with data_parallel_size > 1 or kv_events_config the engines "
                               "run in their own processes: use generate()")
        return self.engine

    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0):
        """Validate and queue one request on the core; returns the core's Request (for
        callers that drive `self.engine.step()` themselves, e.g. tests)."""
        engine = self._engine()
        creq, text = self.inputs.process(prompt, params, request_id, priority)
        return engine.add(creq)

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_step: Callable[[LLMEngine], None] | None = None,
                 priority: Sequence[int] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order, one
        RequestOutput per prompt with `n` CompletionOutputs (SamplingParams.n).

        A prompt is a string, a list of token ids, {"prompt": text} or
        {"prompt_token_ids": [...]} (vLLM's TextPrompt and TokensPrompt).
        `on_step` (optional) is called after every engine step (tests, progress bars).
        `priority`: one per prompt (vLLM's LLM.generate), used by scheduling_policy=priority.
        `use_tqdm`: a progress bar of finished requests on stderr (vLLM's keyword; off by
        default here, so a script's output is its own), or the function that makes it.
        """
        self._check_open()
        if on_step is not None and not callable(on_step):    # (it raised mid-run)
            raise InvalidRequestError(f"on_step must be callable, got {type(on_step).__name__}")
        prompts = _prompt_list(prompts)
        params = _params_list(sampling_params, len(prompts), self.get_default_sampling_params)
        priorities = _priority_list(priority, len(prompts))
        made = [self.inputs.process(p, one, priority=pr)
                for p, sp, pr in zip(prompts, params, priorities) for one in _samples(sp)]
        bar = _progress_bar(use_tqdm, len(made))
        try:
            outs = self._generate_routed(made, on_step, bar) if self.dp is not None \
                else self._generate_here(made, on_step, bar)
        finally:
            if bar is not None:
                bar.close()
        return _gather(outs, [sp.n for sp in params])

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False, chat_template: str | None = None,
             add_generation_prompt: bool = True, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} messages) or a
        list of them, each rendered by `chat_template`, else the tokenizer's, else the
        bundled model's play template (engine/front/chat_template.py, as the server's
        chat completions), with `chat_template_kwargs` as extra template variables
        (enable_thinking, say), then generated as generate() does; one RequestOutput per
        conversation. `continue_final_message` (with add_generation_prompt=False): the
        model continues the last message (an assistant's start, say) instead of
        answering it."""
        if self.tokenizer is None:
            raise InvalidRequestError("this model has no tokenizer: chat needs one (use "
                                      "generate with token-id prompts)")
        template = pick_template(self.tokenizer, chat_template)
        prompts = []
        for conversation in conversations(messages):
            text, ids = render(self.tokenizer, template, conversation,
                               check_bool("add_generation_prompt", add_generation_prompt), tools,
                               chat_template_kwargs,
                               check_bool("continue_final_message", continue_final_message))
            prompts.append({"prompt_token_ids": ids, "prompt": text})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _generate_here(self, made, on_step, bar) -> list[RequestOutput]:
        """The engine in this process: add every request, step until all have ended."""
        results: dict[str, RequestOutput] = {}
        try:
            for creq, text in made:
                self.outputs.add(creq, text, None,
                                 lambda ev: results.__setitem__(ev.request_id, ev.output))
                self.engine.add(creq)
            while self.engine.has_unfinished():
                self._apply(self.engine.step())
                if on_step is not None:
                    on_step(self.engine)
                if bar is not None:
                    bar.update(len(results) - bar.n)
        except BaseException:        # Ctrl-C, or on_step raised: the next call must not
            self._abort([creq.request_id for creq, _ in made])   # run this one's requests
            raise
        return [results[creq.request_id] for creq, _ in made]

    def _abort(self, request_ids: list[str]) -> None:
        """End the requests of an interrupted generate() that are still live (and forget
        one the engine never took: engine.add raised)."""
        for rid in request_ids:
            if self.outputs.has(rid):
                self.outputs.process(self.engine.abort_output(rid))
                self.outputs.fail(rid, REASON_CANCELLED, None)

    def _generate_routed(self, made, on_step, bar) -> list[RequestOutput]:
        """data_parallel_size > 1: every prompt to the replica the router picks."""
        if on_step is not None:
            raise InvalidRequestError("on_step needs data_parallel_size 1 (the engine in "
                                      "this process)")
        streams, outs = [], []
        try:
            for creq, text in made:
                streams.append(self.dp.submit(
                    {"prompt_token_ids": list(creq.prompt_token_ids), "prompt": text},
                    creq.params, priority=creq.priority, on_finish=lambda ev: None))
            for s in streams:
                outs.append(s.result())
                if bar is not None:
                    bar.update(1)
        except BaseException:     # Ctrl-C, or the bar raised: the engines end this call's
            for s in streams:     # requests too (as _generate_here does), not run them out
                if s.output is None:
                    self.dp.cancel(s.request_id)
            raise
        return outs

    def _apply(self, out) -> None:
        for rid in self.outputs.process(out):    # stop strings matched
            self.outputs.process(self.engine.abort_output(rid, REASON_STOP))


def _prompt_list(prompts) -> list:
    """The prompts as a list; a string, a dict or a non-empty list of ints is one prompt
    (vLLM's prompt_to_seq)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if prompts is None or not hasattr(prompts, "__iter__") or isinstance(prompts, bytes):
        raise InvalidRequestError(f"prompts must be a string, token ids, a dict prompt or a "
                                  f"list of them, got {type(prompts).__name__}")
    prompts = list(prompts)
    return [prompts] if prompts and all(isinstance(p, int) for p in prompts) else prompts


def _params_list(sampling_params, n: int, defaults: Callable[[], SamplingParams]
                 ) -> list[SamplingParams]:
    """One SamplingParams per prompt; None (all, or one prompt's) is `defaults()`."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or defaults()] * n
    if isinstance(sampling_params, dict) or not hasattr(sampling_params, "__iter__"):
        raise InvalidRequestError("sampling_params must be a SamplingParams or a list of "
                                  f"them, got {type(sampling_params).__name__}")
    params = list(sampling_params)
    if any(p is None for p in params):
        default = defaults()
        params = [default if p is None else p for p in params]
    bad = [p for p in params if not isinstance(p, SamplingParams)]
    if bad:     # (each is read as one: p.n)
        raise InvalidRequestError("sampling_params must be a SamplingParams or a list of "
                                  f"them, got a list holding {type(bad[0]).__name__}")
    if len(params) != n:
        raise InvalidRequestError(f"sampling_params has {len(params)} entries for "
                                  f"{n} prompts: pass one, or one per prompt")
    return params


def _samples(sp: SamplingParams) -> list[SamplingParams]:
    """A prompt's n requests: n = 1 as given; else sample i with sample_seed (SamplingParams
    checked that every one fits) and only sample 0 asking the prompt's logprobs (one
    computation; the others keep the prefix cache)."""
    if sp.n == 1:
        return [sp]
    return [sp.replace(n=1, seed=sample_seed(sp.seed, i),
                       prompt_logprobs=sp.prompt_logprobs if i == 0 else None)
            for i in range(sp.n)]


def _gather(outs: list[RequestOutput], ns: list[int]) -> list[RequestOutput]:
    """One RequestOutput per prompt: its n samples' completions, index i the i-th (the
    first sample's id, prompt, metrics and prompt logprobs; the first error)."""
    gathered, at = [], 0
    for n in ns:
        group, at = outs[at:at + n], at + n
        if n == 1:
            gathered.append(group[0])
            continue
        completions = tuple(dataclasses.replace(o.outputs[0], index=i)
                            for i, o in enumerate(group))
        error = next((o.error for o in group if o.error is not None), None)
        gathered.append(dataclasses.replace(group[0], outputs=completions, error=error))
    return gathered


def _progress_bar(use_tqdm, total: int):
    """A tqdm bar over `total` requests (None without use_tqdm); use_tqdm may be the
    function that makes it, as in vLLM (e.g. functools.partial(tqdm, leave=False))."""
    make = use_tqdm if callable(use_tqdm) else None
    if (make is None and not check_bool("use_tqdm", use_tqdm)) or not total:
        return None
    if make is None:
        from tqdm import tqdm as make
    return make(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)


def _priority_list(priority, n: int) -> list[int]:
    if priority is None:
        return [0] * n
    if isinstance(priority, (str, bytes, dict)) or not hasattr(priority, "__iter__"):
        raise InvalidRequestError("priority must be a list of integers, one per prompt")
    out = list(priority)
    if len(out) != n:
        raise InvalidRequestError(f"priority has {len(out)} entries for {n} prompts")
    return out

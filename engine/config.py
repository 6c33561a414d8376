"""Every knob of the engine, defined once.

`SchedulerConfig` (engine/scheduler_config.py, re-exported here) holds the live knobs
(changeable from any thread while the engine runs, effective at the next step);
`EngineConfig` holds what is fixed at start; engine/config_json.py the configs given as
vLLM's JSON. Each field carries its help text in `metadata["help"]` (a choice-valued
live knob also its `choices` and a paragraph in `metadata["explain"]` for the help
screen); the CLI builds its flags from these fields and the TUI reads the live ones, so
a knob is never described twice. A field whose text needs more than a type
(`speculative_config`'s JSON) names its parser in `metadata["check"]`, so a bad flag
value is refused by the flag's own parser (exit status 2) in every command. Import them
all from here.

Who holds the live knobs (docs/ARCHITECTURE.md's front and core): the core's Scheduler
holds the ones in force (`Scheduler.knobs`; setting it also sets the block pool's
eviction policy, the one place that happens). A change enters the core only between
steps, through CoreLoop.handle(SetKnobs) (engine/commands.py), which checks it once.
The front's copy (EngineClient.knobs, checked there once) is the last value a caller
asked for, shown to viewers; they are never written back into the core.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from engine.config_json import (  # noqa: F401  (defined there, re-exported: one owner)
    DEFAULT_DISABLE_BY_BATCH_SIZE, DEFAULT_SPECULATIVE_TOKENS, KV_EVENT_PUBLISHERS,
    MAX_SPECULATIVE_TOKENS, SPECULATIVE_ALIASES,
    SPECULATIVE_METHODS, STRUCTURED_OUTPUTS_BACKENDS, KVEventsConfig, SpeculativeConfig,
    StructuredOutputsConfig, check_type, split_speculative_config)
from engine.errors import InvalidRequestError
from engine.generation_config import check_generation_config, parse_override_generation_config
from engine.ranges import (  # noqa: F401  (MAX_SEED, check_priority: re-exported)
    MAX_PRIORITY, MAX_SEED, check_int, check_number, check_priority, seed_bits)
from engine.scheduler_config import (  # noqa: F401  (defined there, re-exported: one owner)
    EVICTION_POLICIES, KNOB_MAXIMUM, PREEMPTION_MODES, SCHEDULING_MODES, SCHEDULING_POLICIES,
    KnobChanges, SchedulerConfig, changed_knobs, check_choices, knob_field)


DEFAULT_MODEL = "default"
# the bundled draft for the bundled model (speculative_config method draft_model)
DEFAULT_DRAFT_MODEL = str(Path(__file__).resolve().parent / "assets" / "shakespeare-draft")
# max_model_len when none is given: the model's, at most this (a 128k-context model
# would otherwise size every block table and decode graph for 128k tokens)
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_CPU_BLOCKS = 2048      # the KV pool on CPU when num_blocks is not given
MAX_TP_SIZE = 64   # ranks of one tensor-parallel group (one host: 8 GPUs in practice)
MAX_KV_OFFLOADING_GIB = 1 << 20    # kv_offloading_size: beyond any host's memory
# vLLM's logprobs_mode values; the first is roseplay's default (docs/SAMPLING.md)
LOGPROBS_MODES = ("processed_logprobs", "processed_logits", "raw_logprobs", "raw_logits")
# vLLM's --kv-cache-dtype values: auto (the model's dtype) or float8 e4m3 (two spellings)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# client_timeout spans several heartbeats of both ends (a client's every 0.5 s, the
# engine's every 1 s: engine/ipc/liveness.py)
CLIENT_TIMEOUT_RANGE = (2.0, 86400.0)
# the router's policies (engine/front/router.py, docs/ROUTING.md)
# (in the order u cycles them: cache_aware's guide steps to round_robin, consistent_hash's
# back to least_load, each with one key)
ROUTING_POLICIES = ("round_robin", "least_load", "consistent_hash", "cache_first",
                    "cache_aware")
MAX_DP_SIZE = 64   # engine replicas behind one front
# vLLM's other names of a knob: LLM(...) keywords (vLLM's EngineArgs field; the older
# num_gpu_blocks) and dtype values (its ModelDType's half and float)
ARGUMENT_ALIASES = {"num_gpu_blocks_override": "num_blocks", "num_gpu_blocks": "num_blocks"}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


TOKEN_COUNT_SUFFIXES = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
                        "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
_TOKEN_COUNT = re.compile(r"(\d+)(?:\.(\d+))?([kmgtKMGT]?)")


def parse_token_count(text: str) -> int:
    """A flag's token count as vLLM's --max-model-len reads one: 4096, 32k (32,000),
    25.6k, 32K (32,768); a binary suffix (upper case) takes a whole number only."""
    match = _TOKEN_COUNT.fullmatch(str(text).strip())
    if match is None:
        raise ValueError("a whole number, with k, m, g, t (x 1000s) or K, M, G, T "
                         "(x 1024s) after it if you like")
    whole, fraction, suffix = match.groups()
    if fraction is not None and suffix.isupper():
        number, decimal = f"{whole}.{fraction}", TOKEN_COUNT_SUFFIXES[suffix.lower()]
        raise ValueError(f"a binary suffix takes a whole number: {number}{suffix.lower()} "
                         f"is {number} x {decimal}")
    value = Decimal(f"{whole}.{fraction or 0}") * TOKEN_COUNT_SUFFIXES.get(suffix, 1)
    if value != int(value):
        raise ValueError("not a whole number of tokens")
    return int(value)


def resolve_max_model_len(given: int | None, model_len: tuple[str, int]) -> int:
    """The engine's max_model_len from the model's (field, length): the given one, else
    the model's capped at DEFAULT_MAX_MODEL_LEN. One above the model's is refused as vLLM
    refuses it; vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN has no counterpart, because the
    position embeddings and the rope table end at the model's length."""
    field, length = model_len
    if given is None:
        return min(DEFAULT_MAX_MODEL_LEN, length)
    if given > length:
        raise InvalidRequestError(
            f"max_model_len ({given}) is greater than the model's maximum ({field}={length} "
            f"in its config): give at most {length}, or leave it unset for "
            f"{min(DEFAULT_MAX_MODEL_LEN, length)}")
    return given


@dataclass(frozen=True)
class EngineConfig:
    """Fixed at start."""

    model: str = knob_field(DEFAULT_MODEL, "Model: 'default' (bundled Shakespeare model), an HF "
                                           "checkpoint directory or hub id, or dummy:<preset>.")
    device: str = knob_field("auto", "auto (CUDA if present, else CPU), cpu, or cuda.",
                             choices=("auto", "cpu", "cuda"))
    dtype: str = knob_field(
        "auto", "Weights and KV dtype: auto (bfloat16 on CUDA, float32 on CPU); vLLM's half "
                "and float name float16 and float32.",
        choices=("auto", "float32", "float16", "bfloat16", *DTYPE_ALIASES))
    block_size: int = knob_field(16, "Tokens per KV block.", minimum=1)
    num_blocks: int | None = knob_field(None, "KV blocks in the pool (default: from "
                                              "gpu_memory_utilization on CUDA, the bytes of "
                                              f"{DEFAULT_CPU_BLOCKS} blocks in the model's dtype "
                                              "on CPU: more with kv_cache_dtype fp8).")
    kv_cache_dtype: str = knob_field(
        "auto", "KV cache dtype (vLLM's --kv-cache-dtype): auto (the model's dtype) or fp8 / "
                "fp8_e4m3 (float8 e4m3 blocks with a scale per layer and KV head, dequantized "
                "inside attention: twice bfloat16's blocks in the same memory, four times "
                "float32's; on CPU it runs the torch_sdpa backend). docs/KV_TIERS.md.",
        choices=KV_CACHE_DTYPES)
    calculate_kv_scales: bool = knob_field(
        False, "With kv_cache_dtype fp8: set each layer's per-head K and V scales from the "
               "first step's values (their largest lands at half the e4m3 range; vLLM's "
               "calculate_kv_scales); off: unit scales, which clip values beyond ±448 "
               "(ignored with auto).")
    kv_offloading_size: float = knob_field(
        0.0, "GiB of host memory for the host KV tier (vLLM's --kv-offloading-size; 0: "
             "off): blocks in the device pool's layout, pinned on CUDA, where full cached "
             "blocks go when the device pool evicts them (found again by prefix lookups "
             "and copied back) and where preemption_mode=swap sends preempted requests' "
             "blocks. With tensor parallelism the total over the ranks. docs/KV_TIERS.md.",
        minimum=0.0)
    gpu_memory_utilization: float = knob_field(0.85, "Fraction of GPU memory for weights, "
                                                     "activations and the KV pool.")
    max_model_len: int | None = knob_field(
        None, f"Longest prompt + output (default: the model's, capped at "
              f"{DEFAULT_MAX_MODEL_LEN}; one above the model's is refused, as in vLLM). "
              f"A flag takes vLLM's 32k (32,000) and 32K (32,768) too.",
        parse=parse_token_count)
    enforce_eager: bool = knob_field(False, "Disable CUDA graphs (steps still run through the "
                                            "graphs' padded buffers, eagerly).")
    cudagraph_mode: str = knob_field(
        "full",
        "CUDA graphs of whole steps: full (decode-only steps per batch size and mixed "
        "prefill + decode steps per token count, up to max_num_batched_tokens at start) or "
        "full_decode_only (mixed steps eager: fewer captures, a faster start).",
        choices=("full", "full_decode_only"))
    async_scheduling: bool = knob_field(True, "Overlap host and device: while a step runs, plan "
                                              "and launch the next one (its pending input tokens "
                                              "stay on the device; vLLM V1's async scheduling).")
    attention_backend: str = knob_field("auto", "Kernels: auto (triton on CUDA; on CPU "
                                                "cpu_native where a C compiler builds it with "
                                                "AVX2 + FMA + F16C or AVX-512, else torch_sdpa), "
                                                "torch (the plain "
                                                "references), "
                                                "torch_sdpa (oneDNN linears + batched SDPA paged "
                                                "attention), cpu_native (torch_sdpa with the "
                                                "decode step's linears and attention in C), "
                                                "triton (CUDA; on a CPU only under "
                                                "TRITON_INTERPRET=1).",
                                        choices=("auto", "torch", "torch_sdpa", "cpu_native",
                                                 "triton"))
    tensor_parallel_size: int = knob_field(
        1, "GPUs (ranks) one model is sharded over: heads, MLP and vocab split, one worker "
           "process per extra rank, NCCL on CUDA (gloo on CPU). Must divide the attention "
           "heads.", minimum=1)
    seed: int = knob_field(0, "Seed for dummy weights and unseeded sampling (replica r of "
                                 "data parallelism samples with seed + r).", minimum=0)
    generation_config: str = knob_field(
        "auto", "Where default sampling parameters come from (vLLM's --generation-config): "
                "auto (default): the model's generation_config.json (its "
                "repetition_penalty, temperature, top_k, top_p, min_p, and max_new_tokens "
                "as max_tokens) for the requests of `roseplay serve` and LLM.generate / "
                "chat that leave them out; vllm: none, the engine's own defaults; a "
                "folder: its generation_config.json, whose max_new_tokens also caps every "
                "request. The app's and bench's workloads set their own "
                "(docs/SAMPLING.md).", check=check_generation_config)
    override_generation_config: dict | str | None = knob_field(
        None, "Generation-config fields set over --generation-config's, as vLLM's JSON, "
              "e.g. '{\"temperature\": 0.5, \"max_new_tokens\": 128}' (repetition_penalty, "
              "temperature, top_k, top_p, min_p, max_new_tokens; null takes one out); it "
              "applies with --generation-config vllm too (docs/SAMPLING.md).",
        check=parse_override_generation_config)
    logprobs_mode: str = knob_field(
        LOGPROBS_MODES[0], "What a request's logprobs hold (vLLM's logprobs_mode): "
        "processed_logprobs (default: log-softmax of the distribution each token is sampled "
        "from, after bias, penalties, temperature, min_p, top-k/top-p), processed_logits, "
        "raw_logprobs (the model's own log-softmax), raw_logits (docs/SAMPLING.md).",
        choices=LOGPROBS_MODES)
    check_invariants: bool = knob_field(
        False, "Check block-pool invariants after every step (slow).")
    client_timeout: float = knob_field(
        60.0, "The stall both ends of the engine process tolerate: seconds without a "
              "message after which the engine drops a client (its requests end with an "
              "error, its pause ends; it is told and attaches again) and a client (the "
              "server, an API server, --connect) judges the engine gone (its requests end "
              "with an error; a server exits 4). Time the judging process itself was "
              "stopped never counts. Far above a GC pause or a stop of tens of seconds.")
    speculative_config: SpeculativeConfig | dict | str | None = knob_field(
        None, "Speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", "
              "\"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1, "
              "\"prompt_lookup_max\": 4}'. Methods: ngram (prompt lookup), draft_model "
              "(alias draft; \"model\": a smaller checkpoint with the target's vocabulary, "
              "default on the bundled model: its bundled draft). \"disable_by_batch_size\": "
              "while more requests than this decode, steps propose no drafts and run as "
              f"plain decode steps (default {DEFAULT_DISABLE_BY_BATCH_SIZE}; null: never "
              "off). docs/SPECULATIVE.md; off by default.", check=SpeculativeConfig.parse)
    structured_outputs_config: StructuredOutputsConfig | dict | str | None = knob_field(
        None, "Structured outputs as vLLM's JSON, e.g. '{\"backend\": \"guidance\", "
              "\"compile_timeout\": 10}': backend auto (llguidance; xgrammar where it cannot read "
              "the tokenizer), guidance (alias llguidance) or xgrammar; "
              "compile_timeout (seconds a request waits for its grammar, then a 400); "
              "grammar_cache_size; disable_any_whitespace; disable_additional_properties "
              "(default true: objects take only the properties their schema lists, as "
              "vLLM's default xgrammar; docs/STRUCTURED_OUTPUTS.md).",
        check=StructuredOutputsConfig.parse)
    kv_events_config: KVEventsConfig | dict | str | None = knob_field(
        None, "KV cache events as vLLM's JSON, e.g. '{\"enable_kv_cache_events\": true, "
              "\"publisher\": \"zmq\", \"endpoint\": \"tcp://127.0.0.1:5557\", "
              "\"replay_endpoint\": \"tcp://127.0.0.1:5558\", \"topic\": \"\"}': the engine "
              "process publishes BlockStored / BlockRemoved / AllBlocksCleared in vLLM's wire "
              "format (docs/ROUTING.md); off by default. Data parallelism turns them on "
              "for its router.", check=KVEventsConfig.parse)
    data_parallel_size: int = knob_field(
        1, "Engine replicas (processes, one per tensor-parallel group of GPUs) behind one "
           "front that routes each request (docs/ROUTING.md).", minimum=1)
    data_parallel_rank: int = knob_field(
        0, "This engine's replica index under data parallelism (set by the front for each "
           "replica: its KV events' data_parallel_rank and GPUs).", minimum=0)
    routing_policy: str = knob_field(
        "least_load", "How the data-parallel front picks a replica (live): round_robin, "
                      "least_load (vLLM's 4 x waiting + running), consistent_hash (on the "
                      "prompt's first block), cache_aware (the longest cached prefix, traded "
                      "against load by Dynamo's cost), cache_first (SGLang's rule: the "
                      "longest cached prefix while the loads are even, else the least "
                      "load): docs/ROUTING.md.", choices=ROUTING_POLICIES)
    kv_overlap_score_weight: float = knob_field(
        1.0, "cache_aware's cost of one prompt block a replica must prefill, against one "
             "KV block in use there (Dynamo's kv_overlap_score_weight; docs/ROUTING.md).")
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self):
        object.__setattr__(self, "kv_events_config",
                           KVEventsConfig.parse(self.kv_events_config))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        self._check_data_parallel()
        spec, k = split_speculative_config(self.speculative_config)
        if spec is not None and spec.method == "draft_model":
            spec = self._draft_model_config(spec)
        object.__setattr__(self, "speculative_config", spec)
        object.__setattr__(self, "structured_outputs_config",
                           StructuredOutputsConfig.parse(self.structured_outputs_config))
        if spec is not None and self.scheduler.num_speculative_tokens == 0:
            # the JSON's k starts the live knob (k's one home) unless the knob is given
            object.__setattr__(self, "scheduler", self.scheduler.replace(
                num_speculative_tokens=k or DEFAULT_SPECULATIVE_TOKENS))
        check_int("block_size", self.block_size, 1)
        if self.num_blocks is not None:
            check_int("num_blocks", self.num_blocks, 2)
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1, MAX_TP_SIZE)
        check_number("gpu_memory_utilization", self.gpu_memory_utilization, 0, 1, lo_open=True)
        if self.max_model_len is not None:
            check_int("max_model_len", self.max_model_len, 1)
        if self.kv_cache_dtype != "auto" and self.attention_backend == "cpu_native":
            raise InvalidRequestError("kv_cache_dtype fp8 needs another attention_backend "
                                      "than cpu_native (its C kernels read float32 KV): "
                                      "auto, torch_sdpa, torch or triton")
        check_number("kv_offloading_size", self.kv_offloading_size, 0, MAX_KV_OFFLOADING_GIB)
        # a seed wider than MAX_SEED failed in torch: 'Overflow when unpacking long long'
        check_int("seed", self.seed, 0, MAX_SEED)
        check_number("client_timeout", self.client_timeout, *CLIENT_TIMEOUT_RANGE)
        check_generation_config(self.generation_config)
        object.__setattr__(self, "override_generation_config",
                           parse_override_generation_config(self.override_generation_config))
        check_choices(self)

    def _check_data_parallel(self) -> None:
        size, rank = self.data_parallel_size, self.data_parallel_rank
        check_type("data_parallel_size", size, (int,), 1)
        check_type("data_parallel_rank", rank, (int,), 0)
        if size > MAX_DP_SIZE or rank >= size:
            raise InvalidRequestError(f"need 0 <= data_parallel_rank < data_parallel_size <= "
                                      f"{MAX_DP_SIZE}, got {rank}, {size}")
        w = self.kv_overlap_score_weight
        check_type("kv_overlap_score_weight", w, (int, float), 0)

    @property
    def sampler_seed(self) -> int:
        """The seed of the sampler's own generator (unseeded requests): `seed` plus the
        data-parallel rank, so that replicas draw apart (two unseeded samples of one
        prompt on two replicas were the same text); weights use `seed` alone."""
        return seed_bits(self.seed + self.data_parallel_rank)

    @property
    def kv_events_enabled(self) -> bool:
        return self.kv_events_config is not None and self.kv_events_config.enabled

    def needs_own_process(self) -> str:
        """What runs the engine in a process of its own ("" for nothing): N replicas, or
        the KV events its process publishes."""
        if self.data_parallel_size > 1:
            return "data_parallel_size > 1"
        return "kv_events_config" if self.kv_events_enabled else ""

    def check_in_process(self) -> None:
        """An engine on a thread of the caller (EngineLoop, LLM) publishes no KV events
        (the engine process does) and is one replica."""
        if self.needs_own_process():
            raise InvalidRequestError("data_parallel_size > 1 and kv_events_config need the "
                                      "engine in its own process (drop --in-process)")

    def _draft_model_config(self, spec: SpeculativeConfig) -> SpeculativeConfig:
        """The draft's model named (the bundled draft for the bundled target); TP=1 only:
        the draft runs on rank 0 beside the target and its pool is not sharded."""
        if self.tensor_parallel_size != 1:
            raise InvalidRequestError("speculative_config method draft_model needs "
                                      "tensor_parallel_size 1")
        if spec.model is not None:
            return spec
        if self.model != DEFAULT_MODEL:
            raise InvalidRequestError("speculative_config method draft_model needs a \"model\" "
                                      "(a draft with the target's vocabulary); only the bundled "
                                      "default model has a bundled draft")
        return dataclasses.replace(spec, model=DEFAULT_DRAFT_MODEL)


def knob_fields(cls) -> list[dataclasses.Field]:
    """The documented fields of a config class (what the CLI turns into flags)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """Split flat keyword arguments into (engine fields, scheduler fields)."""
    sched_names = {f.name for f in dataclasses.fields(SchedulerConfig)}
    engine_names = {f.name for f in dataclasses.fields(EngineConfig)} - {"scheduler"}
    unknown = set(kwargs) - sched_names - engine_names
    if unknown:
        raise InvalidRequestError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
    return ({k: v for k, v in kwargs.items() if k in engine_names},
            {k: v for k, v in kwargs.items() if k in sched_names})


def make_config(**kwargs) -> EngineConfig:
    """Build an EngineConfig from flat keyword arguments (LLM(...) style)."""
    for alias, name in ARGUMENT_ALIASES.items():
        if alias in kwargs:
            if name in kwargs:
                raise InvalidRequestError(f"{alias} and {name} are one argument: give one")
            kwargs[name] = kwargs.pop(alias)
    engine_kw, sched_kw = split_kwargs(kwargs)
    return EngineConfig(**engine_kw, scheduler=SchedulerConfig(**sched_kw))

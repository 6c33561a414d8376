"""Every knob of the engine, defined once.

`SchedulerConfig` holds the live knobs (changeable from any thread while the engine
runs, effective at the next step); `EngineConfig` holds what is fixed at start. Each
field carries its help text in `metadata["help"]` (a choice-valued live knob also its
`choices` and a paragraph in `metadata["explain"]` for the help screen); the CLI builds
its flags from these fields and the TUI reads the live ones, so a knob is never
described twice. A field whose text needs more than a type (`speculative_config`'s JSON)
names its parser in `metadata["check"]`, so a bad flag value is refused by the flag's
own parser (exit status 2) in every command.

Who holds the live knobs (docs/ARCHITECTURE.md's front and core): the core's Scheduler
holds the ones in force (`Scheduler.knobs`; setting it also sets the block pool's
eviction policy, the one place that happens). A change enters the core only between
steps, through EngineCore.set_knobs (the core loop queues one that arrives mid-step).
The front's copies (EngineLoop.knobs, EngineClient.knobs) are the last value a caller
asked for, shown to viewers; they are never written back into the core.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import msgspec


class InvalidRequestError(ValueError):
    """A request, sampling parameter, knob or model name that the engine refuses."""


def _knob(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


DEFAULT_MODEL = "default"
# the bundled draft for the bundled model (speculative_config method draft_model)
DEFAULT_DRAFT_MODEL = str(Path(__file__).resolve().parent / "assets" / "shakespeare-draft")
# upper bounds of the live knobs: far above what any pool here fills (a limit above what
# the pool can hold just never binds), but 10**30 from a client is refused
KNOB_MAXIMUM = {"max_num_batched_tokens": 1 << 20, "max_num_seqs": 1 << 16}
# max_model_len when none is given: the model's, at most this (a 128k-context model
# would otherwise size every block table and decode graph for 128k tokens)
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_CPU_BLOCKS = 2048      # the KV pool on CPU when num_blocks is not given
MAX_TP_SIZE = 64   # ranks of one tensor-parallel group (one host: 8 GPUs in practice)
SCHEDULING_MODES = ("budget", "prefill-first", "mixed-chunk")
SCHEDULING_POLICIES = ("fcfs", "priority", "lpm")
EVICTION_POLICIES = ("lru", "lfu")
PREEMPTION_MODES = ("recompute", "swap")
MAX_KV_OFFLOADING_GIB = 1 << 20    # kv_offloading_size: beyond any host's memory
# vLLM's logprobs_mode values; the first is roseplay's default (docs/SAMPLING.md)
LOGPROBS_MODES = ("processed_logprobs", "processed_logits", "raw_logprobs", "raw_logits")
# oracle: benchmarks only; draft_model (alias "draft"): a smaller model (docs/SPECULATIVE.md)
SPECULATIVE_METHODS = ("ngram", "draft_model", "oracle")
SPECULATIVE_ALIASES = {"draft": "draft_model"}
MAX_SPECULATIVE_TOKENS = 16
MAX_PRIORITY = 2 ** 31 - 1   # a request's priority lies in [-MAX_PRIORITY - 1, MAX_PRIORITY]
# client_timeout spans several heartbeats of both ends (a client's every 0.5 s, the
# engine's every 1 s: engine/ipc/liveness.py)
CLIENT_TIMEOUT_RANGE = (2.0, 86400.0)


def check_priority(priority) -> int:
    """A request's priority (vLLM: lower is served first): an int32."""
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not -MAX_PRIORITY - 1 <= priority <= MAX_PRIORITY:
        raise InvalidRequestError(f"priority must be an integer in [{-MAX_PRIORITY - 1}, "
                                  f"{MAX_PRIORITY}], got {str(priority)[:40]!r}")
    return priority


def check_choices(config) -> None:
    """Every field with `choices` in its metadata holds one of them."""
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        if choices and getattr(config, f.name) not in choices:
            raise InvalidRequestError(f"{f.name} must be one of {', '.join(choices)}, "
                                      f"got {getattr(config, f.name)!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Live knobs: swap the whole object atomically to change them."""

    enable_prefix_caching: bool = _knob(
        True, "Reuse KV blocks of identical prompt prefixes (and prefill identical "
              "prompts once). Turning it off stops lookups and inserts; cached blocks "
              "stay evictable.", live=True)
    max_num_batched_tokens: int = _knob(
        512, "Token budget of one forward: one token per running decode, the rest to "
             "prefill chunks in FIFO order (the chunked-prefill size).", live=True,
        minimum=1, step=64)
    max_num_seqs: int = _knob(
        64, "Most requests admitted (running) at once.", live=True, minimum=1, step=8)
    scheduling_mode: str = _knob(
        "budget", "What one step holds: budget (decodes + prefill chunks under one token "
                  "budget, vLLM V1), prefill-first (all prefill or all decode, nano-vllm), "
                  "mixed-chunk (every decode rides along a prefill step, SGLang "
                  "--enable-mixed-chunk).", live=True, choices=SCHEDULING_MODES,
        explain="budget: each step first gives one token to every running decode, then "
                "spends what is left of max_num_batched_tokens on prefill chunks (vLLM V1's "
                "chunked prefill); more decodes than the budget take turns. prefill-first: "
                "a step is all prefill whenever some prompt work can be scheduled, and all "
                "decode otherwise (nano-vllm, and SGLang without mixed chunks): prompts start "
                "sooner (better TTFT) while every running decode stalls for the prefill "
                "steps (ITL spikes). mixed-chunk: SGLang's --enable-mixed-chunk: every "
                "running decode is in every step, never capped by the budget, and prefill "
                "chunks get the budget minus the decodes (nothing when decodes use it all); "
                "unlike budget, a step can exceed max_num_batched_tokens when many requests "
                "decode, and decodes never wait for their turn.")
    scheduling_policy: str = _knob(
        "fcfs", "Queue order of admission: fcfs (arrival), priority (lower value first, "
                "preempts the lowest priority; vLLM), lpm (longest cached prefix first; "
                "SGLang).", live=True, choices=SCHEDULING_POLICIES,
        explain="fcfs: waiting requests are admitted in arrival order and the newest "
                "running request is preempted when blocks run out (vLLM's default). "
                "priority: each request's priority (an integer, lower first; 0 by default) "
                "orders the queue, ties by arrival, and preemption takes the running request "
                "with the largest value, latest arrival (vLLM's --scheduling-policy "
                "priority). lpm: longest prefix match (SGLang's --schedule-policy lpm): the "
                "waiting request with the most prompt blocks already in the prefix cache is "
                "admitted first, so cached blocks are reused before they are evicted; with "
                "more than 128 waiting (the matching costs time) or prefix caching off it is "
                "fcfs, as in SGLang.")
    eviction_policy: str = _knob(
        "lru", "Which cached prefix block an allocation evicts: lru (least recently "
               "released, vLLM) or lfu (fewest prefix hits, then least recent; SGLang "
               "--radix-eviction-policy lfu).", live=True, choices=EVICTION_POLICIES,
        explain="lru: blocks that no request holds stay cached in the order they were "
                "released (a request's tail blocks first) and the oldest is reused first "
                "(vLLM's free block queue). lfu: the block with the fewest prefix-cache hits "
                "goes first, ties by release order (SGLang's --radix-eviction-policy lfu). A "
                "system prompt hit by every request survives a burst of one-off prompts under "
                "lfu but not under lru (scan resistance); under lfu an old block with many "
                "hits can also outstay its use (cache pollution).")

    preemption_mode: str = _knob(
        "recompute", "What a preempted request's KV becomes: recompute (freed, recomputed "
                     "on re-admission) or swap (copied to the host tier, kv_offloading_size, "
                     "and copied back on re-admission; a full or absent host tier recomputes "
                     "and says so in the event log). docs/KV_TIERS.md.", live=True,
        choices=PREEMPTION_MODES,
        explain="recompute: a preempted request's blocks are freed and its tokens are "
                "computed again when it is re-admitted (vLLM V1's only mode). swap: its "
                "blocks are copied to the host tier before they are freed and copied back "
                "when it is re-admitted, so it resumes where it stopped (vLLM V0's "
                "preemption_mode=swap); where the host tier is off or cannot take every "
                "block, it recomputes and the event log says so (swap_fallback).")

    num_speculative_tokens: int = _knob(
        0, "Draft tokens proposed per decoding request per step and verified in one forward "
           "(speculative decoding, docs/SPECULATIVE.md); 0: off. Starts at "
           "speculative_config's num_speculative_tokens.", live=True, minimum=0, step=1)

    def __post_init__(self):
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(f"num_speculative_tokens must be an integer in "
                                      f"[0, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        for f, top in KNOB_MAXIMUM.items():
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise InvalidRequestError(f"{f} must be an integer in [1, {top}], got {value!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise InvalidRequestError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        check_choices(self)

    def replace(self, **changes) -> "SchedulerConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InvalidRequestError(f"unknown knob(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)


def _changes_struct(cls) -> type[msgspec.Struct]:
    """A typed message of some of `cls`'s fields (each UNSET unless changed), built from
    the dataclass itself so a knob is declared once: decoding it checks every value's
    type and refuses unknown names."""
    hints = typing.get_type_hints(cls)
    fields = [(f.name, hints[f.name] | msgspec.UnsetType, msgspec.UNSET)
              for f in dataclasses.fields(cls)]
    return msgspec.defstruct(f"{cls.__name__}Changes", fields, frozen=True,
                             omit_defaults=True, forbid_unknown_fields=True, module=__name__)


KnobChanges = _changes_struct(SchedulerConfig)


def knob_changes(**changes) -> KnobChanges:
    """Changed live knobs as the typed message (unknown names refused)."""
    unknown = set(changes) - set(KnobChanges.__struct_fields__)
    if unknown:
        raise InvalidRequestError(f"unknown knob(s): {', '.join(sorted(unknown))}")
    return KnobChanges(**changes)


def changed_knobs(changes: KnobChanges) -> dict:
    """The fields a KnobChanges sets, as keyword arguments for SchedulerConfig.replace."""
    return {k: v for k, v in msgspec.structs.asdict(changes).items() if v is not msgspec.UNSET}


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config (its field names): how drafts are proposed. Fixed at
    start; the live knob SchedulerConfig.num_speculative_tokens turns speculation on and
    off and sets k (docs/SPECULATIVE.md)."""
    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1      # n-gram sizes matched, longest first
    prompt_lookup_max: int = 4
    oracle_acceptance: float = 1.0  # method oracle: chance that a draft is the target's token
    oracle_references: str | None = None   # method oracle: JSON file of the target's outputs
    # method draft_model: the draft's checkpoint (same vocabulary as the target); None on
    # the bundled default target: the bundled draft (engine/assets/shakespeare-draft)
    model: str | None = None

    def __post_init__(self):
        """Every field's type and range (a JSON value of any type may arrive here from
        `--speculative-config`: each is refused with InvalidRequestError, never a
        TypeError)."""
        if not isinstance(self.method, str):
            raise InvalidRequestError(f"speculative_config method must be a string, got "
                                      f"{self.method!r:.60}")
        object.__setattr__(self, "method", SPECULATIVE_ALIASES.get(self.method, self.method))
        if self.method not in SPECULATIVE_METHODS:
            raise InvalidRequestError(f"speculative_config method must be one of "
                                      f"{', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(f"num_speculative_tokens must be an integer in "
                                      f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) \
                or not 1 <= lo <= hi <= 64:
            raise InvalidRequestError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max <= 64, "
                                      f"got {lo!r}, {hi!r}")
        p = self.oracle_acceptance
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise InvalidRequestError(f"oracle_acceptance must be a number in [0, 1], got "
                                      f"{p!r:.60}")
        if self.oracle_references is not None and not isinstance(self.oracle_references, str):
            raise InvalidRequestError(f"oracle_references must be a file path (a string), "
                                      f"got {self.oracle_references!r:.60}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise InvalidRequestError(f"speculative_config model must be a non-empty string, "
                                      f"got {self.model!r}")

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        """From a SpeculativeConfig, a dict, or vLLM's JSON text (`--speculative-config`)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as exc:
                raise InvalidRequestError(f"speculative_config is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidRequestError(f"speculative_config must be an object, got {value!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - names
        if unknown:
            raise InvalidRequestError(f"unknown speculative_config field(s): "
                                      f"{', '.join(sorted(unknown))}")
        return cls(**value)


@dataclass(frozen=True)
class EngineConfig:
    """Fixed at start."""

    model: str = _knob(DEFAULT_MODEL, "Model: 'default' (bundled Shakespeare model), an HF "
                                      "checkpoint directory or hub id, or dummy:<preset>.")
    device: str = _knob("auto", "auto (CUDA if present, else CPU), cpu, or cuda.",
                        choices=("auto", "cpu", "cuda"))
    dtype: str = _knob("auto", "Weights and KV dtype: auto (bfloat16 on CUDA, float32 on CPU).",
                       choices=("auto", "float32", "float16", "bfloat16"))
    block_size: int = _knob(16, "Tokens per KV block.", minimum=1)
    num_blocks: int | None = _knob(None, "KV blocks in the pool (default: from "
                                         "gpu_memory_utilization on CUDA, "
                                         f"{DEFAULT_CPU_BLOCKS} on CPU).")
    kv_offloading_size: float = _knob(
        0.0, "GiB of host memory for the host KV tier (vLLM's --kv-offloading-size; 0: "
             "off): blocks in the device pool's layout, pinned on CUDA, where full cached "
             "blocks go when the device pool evicts them (found again by prefix lookups "
             "and copied back) and where preemption_mode=swap sends preempted requests' "
             "blocks. With tensor parallelism the total over the ranks. docs/KV_TIERS.md.",
        minimum=0.0)
    gpu_memory_utilization: float = _knob(0.85, "Fraction of GPU memory for weights, "
                                                "activations and the KV pool.")
    max_model_len: int | None = _knob(
        None, f"Longest prompt + output (default: the model's, capped at "
              f"{DEFAULT_MAX_MODEL_LEN}; a value above the model's is lowered to it).")
    enforce_eager: bool = _knob(False, "Disable CUDA graphs (steps still run through the "
                                       "graphs' padded buffers, eagerly).")
    cudagraph_mode: str = _knob(
        "full",
        "CUDA graphs of whole steps: full (decode-only steps per batch size and mixed "
        "prefill + decode steps per token count, up to max_num_batched_tokens at start) or "
        "full_decode_only (mixed steps eager: fewer captures, a faster start).",
        choices=("full", "full_decode_only"))
    async_scheduling: bool = _knob(True, "Overlap host and device: while a step runs, plan "
                                         "and launch the next one (its pending input tokens "
                                         "stay on the device; vLLM V1's async scheduling).")
    attention_backend: str = _knob("auto", "Kernels: auto (triton on CUDA; on CPU "
                                           "cpu_native where a C compiler builds it with "
                                           "AVX-512, else torch_sdpa), torch (the plain "
                                           "references), "
                                           "torch_sdpa (oneDNN linears + batched SDPA paged "
                                           "attention), cpu_native (torch_sdpa with the "
                                           "decode step's linears and attention in C), "
                                           "triton.",
                                   choices=("auto", "torch", "torch_sdpa", "cpu_native",
                                            "triton"))
    tensor_parallel_size: int = _knob(
        1, "GPUs (ranks) one model is sharded over: heads, MLP and vocab split, one worker "
           "process per extra rank, NCCL on CUDA (gloo on CPU). Must divide the attention "
           "heads.", minimum=1)
    seed: int = _knob(0, "Seed for dummy weights and unseeded sampling.")
    logprobs_mode: str = _knob(
        LOGPROBS_MODES[0], "What a request's logprobs hold (vLLM's logprobs_mode): "
        "processed_logprobs (default: log-softmax of the distribution each token is sampled "
        "from, after bias, penalties, temperature, min_p, top-k/top-p), processed_logits, "
        "raw_logprobs (the model's own log-softmax), raw_logits (docs/SAMPLING.md).",
        choices=LOGPROBS_MODES)
    check_invariants: bool = _knob(False, "Check block-pool invariants after every step (slow).")
    client_timeout: float = _knob(
        60.0, "The stall both ends of the engine process tolerate: seconds without a "
              "message after which the engine drops a client (its requests end with an "
              "error, its pause ends; it is told and attaches again) and a client (the "
              "server, an API server, --connect) judges the engine gone (its requests end "
              "with an error; a server exits 4). Time the judging process itself was "
              "stopped never counts. Far above a GC pause or a stop of tens of seconds.")
    speculative_config: SpeculativeConfig | dict | str | None = _knob(
        None, "Speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", "
              "\"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1, "
              "\"prompt_lookup_max\": 4}'. Methods: ngram (prompt lookup), draft_model "
              "(alias draft; \"model\": a smaller checkpoint with the target's vocabulary, "
              "default on the bundled model: its bundled draft), oracle (benchmarks only). "
              "docs/SPECULATIVE.md; off by default.", check=SpeculativeConfig.parse)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self):
        spec = SpeculativeConfig.parse(self.speculative_config)
        if spec is not None and spec.method == "draft_model":
            spec = self._draft_model_config(spec)
        object.__setattr__(self, "speculative_config", spec)
        if spec is not None and self.scheduler.num_speculative_tokens == 0:
            object.__setattr__(self, "scheduler", self.scheduler.replace(
                num_speculative_tokens=spec.num_speculative_tokens))
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidRequestError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int)
                                            or self.num_blocks < 2):
            raise InvalidRequestError(f"num_blocks must be an integer >= 2, got {self.num_blocks!r}")
        tps = self.tensor_parallel_size
        if isinstance(tps, bool) or not isinstance(tps, int) or not 1 <= tps <= MAX_TP_SIZE:
            raise InvalidRequestError(
                f"tensor_parallel_size must be an integer in [1, {MAX_TP_SIZE}], got {tps!r}")
        gmu = self.gpu_memory_utilization
        if isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0.0 < gmu <= 1.0:
            raise InvalidRequestError(f"gpu_memory_utilization must be in (0, 1], got {gmu!r}")
        if self.max_model_len is not None and (isinstance(self.max_model_len, bool) or not
                                               isinstance(self.max_model_len, int)
                                               or self.max_model_len < 1):
            raise InvalidRequestError(
                f"max_model_len must be an integer >= 1, got {self.max_model_len!r}")
        size = self.kv_offloading_size
        if isinstance(size, bool) or not isinstance(size, (int, float)) \
                or not 0.0 <= size <= MAX_KV_OFFLOADING_GIB:
            raise InvalidRequestError(f"kv_offloading_size must be a number of GiB in "
                                      f"[0, {MAX_KV_OFFLOADING_GIB}], got {size!r}")
        ct, (lo, hi) = self.client_timeout, CLIENT_TIMEOUT_RANGE
        if isinstance(ct, bool) or not isinstance(ct, (int, float)) or not lo <= ct <= hi:
            raise InvalidRequestError(f"client_timeout must be in [{lo:g}, {hi:g}] seconds, "
                                      f"got {ct!r}")
        check_choices(self)

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
    if "num_gpu_blocks" in kwargs:  # vLLM's spelling
        kwargs["num_blocks"] = kwargs.pop("num_gpu_blocks")
    engine_kw, sched_kw = split_kwargs(kwargs)
    return EngineConfig(**engine_kw, scheduler=SchedulerConfig(**sched_kw))

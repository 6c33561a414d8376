"""The live knobs: `SchedulerConfig`, changeable from any thread while the engine runs,
effective at the next step, and `KnobChanges`, the typed message of some of them.

Who holds them (docs/ARCHITECTURE.md's front and core): the core's Scheduler holds the
ones in force (`Scheduler.knobs`; setting it also sets the block pool's eviction
policy, the one place that happens). A change enters the core only between steps,
through `LLMEngine.set_knobs` (engine/core/core.py; the core loop queues one that
arrives mid-step). The front's copies (EngineLoop.knobs, EngineClient.knobs) are the
last value a caller asked for, shown to viewers; they are never written back into the
core. engine/config.py re-exports everything here: import from there.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

import msgspec

from engine.config_json import MAX_SPECULATIVE_TOKENS
from engine.errors import InvalidRequestError
from engine.ranges import check_int

# upper bounds of the live knobs: far above what any pool here fills (a limit above what
# the pool can hold just never binds), but 10**30 from a client is refused
KNOB_MAXIMUM = {"max_num_batched_tokens": 1 << 20, "max_num_seqs": 1 << 16}
SCHEDULING_MODES = ("budget", "prefill-first", "mixed-chunk")
SCHEDULING_POLICIES = ("fcfs", "priority", "lpm")
EVICTION_POLICIES = ("lru", "lfu")
PREEMPTION_MODES = ("recompute", "swap")


def knob_field(default, help: str, **extra):
    """A config field with its help text (and choices, bounds, parser) in its metadata."""
    return field(default=default, metadata={"help": help, **extra})


def check_choices(config) -> None:
    """Every field with `choices` in its metadata holds one of them, and every bool field
    a bool (LLM(enforce_eager="no") was taken, as a true value)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type in ("bool", bool) and not isinstance(value, bool):
            raise InvalidRequestError(f"{f.name} must be a bool, got {value!r}")
        choices = f.metadata.get("choices")
        if choices and getattr(config, f.name) not in choices:
            raise InvalidRequestError(f"{f.name} must be one of {', '.join(choices)}, "
                                      f"got {getattr(config, f.name)!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Live knobs: swap the whole object atomically to change them."""

    enable_prefix_caching: bool = knob_field(
        True, "Reuse KV blocks of identical prompt prefixes (and prefill identical "
              "prompts once). Turning it off stops lookups and inserts; cached blocks "
              "stay evictable.", live=True)
    max_num_batched_tokens: int = knob_field(
        512, "Token budget of one forward: one token per running decode, the rest to "
             "prefill chunks in FIFO order (the chunked-prefill size).", live=True,
        minimum=1, step=64)
    max_num_seqs: int = knob_field(
        64, "Most requests admitted (running) at once.", live=True, minimum=1, step=8)
    scheduling_mode: str = knob_field(
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
    scheduling_policy: str = knob_field(
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
    eviction_policy: str = knob_field(
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

    preemption_mode: str = knob_field(
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

    num_speculative_tokens: int = knob_field(
        0, "Draft tokens proposed per decoding request per step and verified in one forward "
           "(speculative decoding, docs/SPECULATIVE.md); 0: off. Starts at "
           "speculative_config's num_speculative_tokens.", live=True, minimum=0, step=1)

    def __post_init__(self):
        check_int("num_speculative_tokens", self.num_speculative_tokens, 0,
                  MAX_SPECULATIVE_TOKENS)
        for f, top in KNOB_MAXIMUM.items():
            check_int(f, getattr(self, f), 1, top)
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


def changed_knobs(changes: KnobChanges) -> dict:
    """The fields a KnobChanges sets, as keyword arguments for SchedulerConfig.replace."""
    return {k: v for k, v in msgspec.structs.asdict(changes).items() if v is not msgspec.UNSET}

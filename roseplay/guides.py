"""Knob guidance: what vLLM's and SGLang's tuning guides say, each claim with a setup
that shows it live.

A `Guide` pairs one claim (and where it comes from) with a scenario, knob values and
a workload; the help screen lists them and one key (1-9) switches the running engine
to that setup (`apply_guide`). Knobs a guide names that this engine's SchedulerConfig
does not have (yet) are skipped and said, so the table may name policy knobs before
they land. Sources (docs/TUI.md cites them):

* vLLM, Optimization and Tuning: https://docs.vllm.ai/en/stable/configuration/optimization/
* vLLM, Automatic Prefix Caching: https://docs.vllm.ai/en/stable/features/automatic_prefix_caching.html
* SGLang, Hyperparameter Tuning: https://docs.sglang.io/advanced_features/hyperparameter_tuning.html
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import SchedulerConfig, knob_fields

VLLM = "vLLM Optimization and Tuning"
VLLM_APC = "vLLM Automatic Prefix Caching"
SGLANG = "SGLang Hyperparameter Tuning"


@dataclass(frozen=True)
class Guide:
    key: str
    claim: str
    source: str
    watch: str                     # what to look at once it runs
    scenario: str
    knobs: dict = field(default_factory=dict)
    concurrency: int | None = None
    rate: float | None = None


GUIDES = (
    Guide("1", "A small token budget (max_num_batched_tokens) gives better inter-token "
               "latency: fewer prefill tokens slow down each step's decodes.", VLLM,
          "ITL and TPOT low and flat; long prompts take many chunks (TTFT up)",
          "long-short", {"max_num_batched_tokens": 32}, concurrency=16),
    Guide("2", "A large token budget gives better time to first token: more prompt "
               "tokens are prefilled per step.", VLLM,
          "TTFT down against key 1; ITL spikes when a long prompt is prefilled",
          "long-short", {"max_num_batched_tokens": 2048}, concurrency=16),
    Guide("3", "Frequent preemption (not enough KV blocks for every running request) "
               "costs end-to-end latency: the preempted requests recompute.", VLLM,
          "P flashes on the KV map, the preempted count rising, TPOT p99 up",
          "random", {"max_num_seqs": 256}, concurrency=256),
    Guide("4", "Against preemption: lower max_num_seqs (or max_num_batched_tokens), or "
               "give the KV cache more memory.", VLLM,
          "no more P flashes: 32 running requests fit the pool, the rest wait",
          "random", {"max_num_seqs": 32}, concurrency=256),
    Guide("5", "Prefix caching reuses the KV blocks of prompts that start alike: "
               "shared system prompts are prefilled once.", VLLM_APC,
          "orange shared blocks and blue cached ones, a high hit rate, TTFT low",
          "shared-prefix", {"enable_prefix_caching": True}, concurrency=16),
    Guide("6", "The same workload without prefix caching prefills every shared prefix "
               "again.", VLLM_APC,
          "hit rate 0, no shared blocks, TTFT and KV use up against key 5",
          "shared-prefix", {"enable_prefix_caching": False}, concurrency=16),
    Guide("7", "Throughput needs a large batch: keep requests queued so the running "
               "batch stays full (a queue that is always empty means the client sends "
               "too slowly).", SGLANG,
          "tok/s low with 2 in flight; compare key 8",
          "random", {"max_num_seqs": 64}, concurrency=2),
    Guide("8", "With enough requests waiting, the batch and the KV usage grow, and so "
               "does throughput (until preemption starts).", SGLANG,
          "tok/s several times key 7's; the waiting column non-empty",
          "random", {"max_num_seqs": 64}, concurrency=96),
    Guide("9", "Longest-prefix-match ordering (schedule policy lpm) suits workloads with "
               "many shared prefixes: requests whose prefix is cached go first.", SGLANG,
          "with the scheduling_policy knob: hit rate and TTFT against fcfs",
          "shared-prefix", {"scheduling_policy": "lpm", "enable_prefix_caching": True},
          concurrency=48),
)
BY_KEY = {g.key: g for g in GUIDES}


def live_names() -> set[str]:
    return {f.name for f in knob_fields(SchedulerConfig) if f.metadata.get("live")}


def split_knobs(guide: Guide, fixed: str | None = None) -> tuple[dict, list[str]]:
    """(knobs this engine can set, names it skips): unknown knobs, and `fixed` (the
    knob a compare view holds per side)."""
    names = live_names() - {fixed}
    usable = {k: v for k, v in guide.knobs.items() if k in names}
    return usable, [k for k in guide.knobs if k not in usable]


def apply_guide(source, guide: Guide) -> list[str]:
    """Switch a live source to the guide's setup; returns the knob names skipped."""
    knobs, skipped = split_knobs(guide, getattr(source, "knob", None))
    if knobs:
        source.set_knobs(**knobs)
    source.set_scenario(guide.scenario)
    if guide.concurrency is not None:
        source.set_concurrency(guide.concurrency)
    source.set_rate(guide.rate)
    return skipped


def describe(guide: Guide) -> str:
    setup = ", ".join(f"{k}={v}" for k, v in guide.knobs.items())
    return (f"{guide.scenario}, {setup}, {guide.concurrency or '∞'} in flight"
            + (f", {guide.rate:g} req/s" if guide.rate else ""))

"""Knob guidance: what vLLM's and SGLang's tuning guides say, each claim an experiment
with a setup that shows it live, rewritten where this engine shows something else.

A `Guide` pairs one claim (and where it comes from) with a scenario, knob values and
a workload; the help screen lists them and one key (1-9) switches the running engine
to that setup (`apply_guide`). Knobs a guide names that this engine's SchedulerConfig
does not have (yet) are skipped and said, so the table may name policy knobs before
they land. Sources (docs/TUI.md cites them):

* vLLM, Optimization and Tuning: https://docs.vllm.ai/en/stable/configuration/optimization/
* vLLM, Automatic Prefix Caching: https://docs.vllm.ai/en/stable/features/automatic_prefix_caching.html
* SGLang, Hyperparameter Tuning: https://docs.sglang.io/advanced_features/hyperparameter_tuning.html
* SGLang, Radix Cache Eviction Policies: https://docs.sglang.io/docs/advanced_features/radix_eviction_policy
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import ROUTING_POLICIES, SchedulerConfig, knob_fields
from roseplay.tui.defaults import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS

VLLM = "vLLM Optimization and Tuning"
VLLM_APC = "vLLM Automatic Prefix Caching"
SGLANG = "SGLang Hyperparameter Tuning"
SGLANG_EVICT = "SGLang Radix Cache Eviction Policies"
VLLM_SPEC = "vLLM Speculative Decoding"
ROUTERS = "llm-d and NVIDIA Dynamo, KV-cache-aware routing"
POOL_BLOCKS = TUI_NUM_BLOCKS     # the pool the guides are tuned for: the app's default
# the app's default workload: guides that turn one knob of it start from these
APP, APP_CONCURRENCY = {"max_num_seqs": TUI_MAX_NUM_SEQS}, TUI_CONCURRENCY


@dataclass(frozen=True)
class Guide:
    """One experiment: `knobs` over the clean default (every other live knob at its
    engine/config.py default), a scenario, the requests in flight and the rate.

    `versus` is the guide it is measured against (the other side of its compare pair,
    `compare`: run both at once with `roseplay --compare KNOB=A,B`), and `expect` the
    direction of each named number: "lower" / "higher" / "no later" (at most x1.5) than
    the `versus` guide's, or ">0" / "=0" on its own.
    tests/roseplay/tui/test_guides_verified.py checks every one of them on the bundled
    model on the CPU.
    """
    key: str
    claim: str
    source: str
    watch: str                     # what to look at once it runs
    scenario: str
    knobs: dict = field(default_factory=dict)
    concurrency: int | None = None
    rate: float | None = None
    versus: str | None = None
    expect: dict = field(default_factory=dict)
    compare: str | None = None     # KNOB=A,B for `roseplay --compare`
    shows: tuple = ()              # what appears on a 120x40 screen (regexes): its setup on
    #                                the scorecard, then what to watch, within
    within: float = 5.0            # this many seconds of a clean window (on an idle box;
    #                                tests/roseplay/tui/test_tui_guides_tmux.py)
    full_pool: bool = False        # the claim holds once the pool evicts: measured from then
    view: dict = field(default_factory=dict)   # the request list's sort / filter it sets
    routing: str | None = None     # the data-parallel router's policy it sets (a guide
    #                                with one needs roseplay --data-parallel-size 2)


GUIDES = (
    Guide("1", "A small token budget (max_num_batched_tokens) cuts a long prompt into many "
               "chunks, one per step, each riding along the decodes (more steps mix the two), "
               "so no step stalls the decodes with a whole prompt: ITL is smoother (p99 "
               "down). Whether the documents' first token comes later depends on a step's "
               "fixed cost: large on a GPU (vLLM's trade: smoother ITL, later TTFT), small "
               "on this CPU engine, where TTFT p50 comes no later than key 2's (x0.3-1.0 "
               "measured; the scorecard allows x1.5 for a loaded machine's noise).",
          VLLM, "chunk k/n at the top of the request list (sorted by state: prefilling "
          "first) and in This step; chunks per prompt up against key 2",
          "mixed", {"max_num_batched_tokens": 32, **APP}, concurrency=APP_CONCURRENCY, versus="2",
          expect={"chunks_p90": "higher", "mixed_steps": "higher", "itl_p99": "lower",
                  "ttft_p50": "no later"},
          compare="max_num_batched_tokens=32,2048", view={"sort": "state"},
          shows=(r"budget 32 tok/step", r"chunk \d+/\d+")),
    Guide("2", "A large token budget prefills a whole prompt in one step: one chunk per "
               "prompt, and fewer steps carry decodes and prefill together.", VLLM,
          "the event log: each prompt's prefill done in one chunk (chunk done … N/N "
          "tokens); chunks per prompt down against key 1",
          "mixed", {"max_num_batched_tokens": 2048, **APP}, concurrency=APP_CONCURRENCY,
          versus="1",
          expect={"chunks_p90": "lower", "mixed_steps": "lower"},
          compare="max_num_batched_tokens=32,2048", view={"sort": "state"},
          # a prompt of 100+ tokens prefilled in one chunk: the event log keeps it for a
          # few seconds (This step showed it for one step only)
          shows=(r"budget 2048 tok/step", r"prefill chunk (\d{3,})/\1 tokens")),
    Guide("3", "More running requests than the KV pool holds (max_num_seqs 256 on 512 "
               "blocks) forces preemption: requests are freed and recompute their prompt "
               "later.", VLLM,
          "P flashes on the KV map, the preempted count rising, KV use near 100%",
          "random", {"max_num_seqs": 256}, concurrency=256, versus="4",
          expect={"preemptions": ">0", "kv_used": "higher"}, compare="max_num_seqs=256,32",
          shows=(r"max seqs 256", r"preempted [1-9]"), within=10.0),
    Guide("4", "Against preemption: lower max_num_seqs (or give the KV cache more memory); "
               "the requests that do not fit wait in the queue instead.", VLLM,
          "no P flashes, preempted stays 0; the waiting column fills, KV use lower",
          "random", {"max_num_seqs": 32}, concurrency=256, versus="3",
          expect={"preemptions": "=0", "waiting": "higher"}, compare="max_num_seqs=256,32",
          shows=(r"max seqs 32\b", r"running 3[0-2] +waiting \d{3}")),
    Guide("5", "Prefix caching reuses the KV blocks of prompts that start alike: the "
               "shared system prompts and the reference documents are prefilled once.",
          VLLM_APC,
          "orange shared blocks (digit = refcount), blue ░ cached ones, hit rate high, "
          "TTFT low against key 6",
          "mixed", {"enable_prefix_caching": True, **APP}, concurrency=APP_CONCURRENCY,
          versus="6", expect={"hit_rate": "higher", "ttft_p50": "lower"},
          compare="enable_prefix_caching=true,false",
          shows=(r"prefix cache ON", r"hit rate [4-9]\d%/"), within=8.0),
    Guide("6", "The same workload without prefix caching prefills every shared prefix "
               "again.", VLLM_APC,
          "hit rate 0, TTFT and KV use up against key 5",
          "mixed", {"enable_prefix_caching": False, **APP}, concurrency=APP_CONCURRENCY,
          versus="5", expect={"hit_rate": "=0", "kv_used": "higher"},
          compare="enable_prefix_caching=true,false",
          shows=(r"prefix cache OFF", r"hit rate 0%/"), within=7.0),
    Guide("7", "Throughput needs a large batch: keep requests queued so the running "
               "batch stays full (a queue that is always empty means the client sends "
               "too slowly).", SGLANG,
          "tok/s low with 2 in flight; compare key 8",
          "random", {}, concurrency=2, versus="8", expect={"tok_s": "lower"},
          shows=(r"· 2 in flight", r"running [0-2] +waiting 0")),
    Guide("8", "With enough requests waiting, the batch and the KV usage grow, and so "
               "does throughput (until preemption starts).", SGLANG,
          "tok/s several times key 7's; the running and waiting counts up",
          "random", {}, concurrency=96, versus="7",
          expect={"tok_s": "higher", "running": "higher", "kv_used": "higher"},
          shows=(r"· 96 in flight", r"running (6[0-4]|[4-5]\d) ")),
    Guide("9", "A priority queue (scheduling_policy priority) serves the chat turns "
               "(priority 0, most requests) before the queued documents (priority 1): "
               "the median time to first token drops against fcfs.", VLLM,
          "the request list's pri column: documents (1) wait while chat turns (0) start; "
          "TTFT down against P back to fcfs",
          "mixed", {"scheduling_policy": "priority", **APP}, concurrency=APP_CONCURRENCY,
          versus="default", expect={"ttft_p50": "lower"},
          compare="scheduling_policy=priority,fcfs",
          shows=(r"queue priority", r"waiting \d{2}")),
    Guide("0", "Once the pool is full, every new block evicts a cached one. lru evicts "
               "the least recently released: the one-off documents and answers push out "
               "a reference document before it is asked about again, and the first of "
               "its next two questions prefills it anew. lfu evicts the blocks with the "
               "fewest hits first: a reference document that was asked about stays, so "
               "the prefix hit rate is higher.", SGLANG_EVICT,
          "hit rate (legend, hit % plot) up against lru within seconds, once evictions "
          "run (evicted N/s); e flips it back",
          "mixed", {"eviction_policy": "lfu", **APP}, concurrency=APP_CONCURRENCY,
          versus="default", expect={"hit_rate": "higher"}, full_pool=True,
          compare="eviction_policy=lru,lfu",
          shows=(r"evict lfu", r"evicted [1-9]\d*/s"), within=8.0),
    Guide("d", "Speculative decoding on repetitive text: the n-gram drafter proposes the "
               "tokens that followed the last match in the request's own text, the target "
               "verifies them in one forward and keeps the prefix it agrees with. Here "
               "the bundled model continues each opening in a loop (greedy), so most "
               "drafts are right (mean accepted length about 3.4 of 4 at k = 3), and a "
               "verify of 1 + k rows costs this CPU about one decode step at batch 1: "
               "TPOT falls to 0.45-0.7x the spec-off run's (roseplay bench, 2026-11-25). "
               "With 16 requests in flight the rows cost compute the batch has no spare "
               "of, and throughput falls: x0.7 on the app's default workload (sampled at "
               "0.8: about 9% of drafts right), x0.6 even on this text "
               "(docs/SPECULATIVE.md; the GPU figures are in docs/PERF.md).",
          VLLM_SPEC, "TPOT p50 in Timing (up again with D x3: spec off), This step's spec "
          "line (drafted -> accepted), the accepted % and accept len plots",
          "repetitive", {"num_speculative_tokens": 3}, concurrency=1, versus="spec-off",
          expect={"tpot_p50": "lower", "spec_acceptance": ">0",
                  "spec_mean_accepted_len": "higher"},
          compare="num_speculative_tokens=0,3",
          shows=(r"spec k 3 drafts", r"spec (\d+) drafted → \1 accepted"),
          within=8.0),
)
BY_KEY = {g.key: g for g in GUIDES}
# data parallelism: guides that need roseplay --data-parallel-size 2 (the claims are
# checked on two replicas: tests/roseplay/tui/test_guides_routing.py)
ROUTING_GUIDES = (
    Guide("a", "Across replicas, a router that knows what each one caches keeps a shared "
               "prefix on the replica that holds it. 31 manuals that together overflow "
               "one replica's pool (half of them fit): round robin sends every manual to "
               "both replicas, each pool evicts it before it comes back, and the prefix "
               "hit rate stays near 0; cache_aware routes each manual to the replica whose "
               "KV events say it holds it, and the hit rate climbs.", ROUTERS,
          "the maps' hit %: each manual's first request misses under any policy; once "
          "they come back (after 31 requests) round robin's stays 0 while cache_aware's "
          "climbs; the routing card's cached column (20/20 on the winner); u: round_robin",
          "manuals", dict(APP), concurrency=16, routing="cache_aware",
          versus="round-robin", expect={"hit_rate": "higher"}),
    Guide("b", "A sticky policy under skew: consistent_hash sends prompts that start "
               "alike to one replica, blind to its load. With 7 of 8 requests on one hot "
               "document it pins them to one replica: its queue grows (max_num_seqs 4 "
               "there) while the other idles; least_load spreads them by 4 x waiting + "
               "running and almost nothing waits.", ROUTERS,
          "the maps: one replica full with a queue under it, the other idle; requests "
          "per replica far apart (imbalance near 2); the routing card: the ring's owner "
          "whatever its load; U back to least_load",
          "hot-prefix", {"max_num_seqs": 4}, concurrency=8, routing="consistent_hash",
          versus="least-load", expect={"queued": "higher"}),
)
ROUTING_BASELINES = {
    "round-robin": Guide("round-robin", "guide a under round_robin", ROUTERS, "",
                         "manuals", dict(APP), concurrency=16, routing="round_robin"),
    "least-load": Guide("least-load", "guide b under least_load", ROUTERS, "",
                        "hot-prefix", {"max_num_seqs": 4}, concurrency=8,
                        routing="least_load")}
# the baselines a guide is measured against that have no key of their own: the app's
# default setup (guides 9 and 0 turn one knob of it)
BASELINES = {"default": Guide("default", "the app's default setup", VLLM, "", "mixed",
                              dict(APP), concurrency=APP_CONCURRENCY),
             "spec-off": Guide("spec-off", "guide d without speculation", VLLM_SPEC, "",
                               "repetitive", {}, concurrency=1)}


def find(key: str | None) -> Guide | None:
    """A guide or a baseline by its key (the routing ones too)."""
    for table in (BY_KEY, BASELINES, {g.key: g for g in ROUTING_GUIDES}, ROUTING_BASELINES):
        if key in table:
            return table[key]
    return None


def live_names() -> set[str]:
    return {f.name for f in knob_fields(SchedulerConfig) if f.metadata.get("live")}


def split_knobs(guide: Guide, fixed: str | None = None) -> tuple[dict, list[str]]:
    """(knobs this engine can set, names it skips): unknown knobs, and `fixed` (the
    knob a compare view holds per side)."""
    names = live_names() - {fixed}
    usable = {k: v for k, v in guide.knobs.items() if k in names}
    return usable, [k for k in guide.knobs if k not in usable]


def clean_knobs(guide: Guide, fixed: str | None = None) -> dict:
    """Every live knob: the guide's value, else engine/config.py's default (`fixed`, the
    knob a compare view holds per side, left out)."""
    defaults = SchedulerConfig()
    usable, _ = split_knobs(guide, fixed)
    return {name: usable.get(name, getattr(defaults, name)) for name in sorted(live_names())
            if name != fixed}


def apply_guide(source, guide: Guide) -> list[str]:
    """Switch a live source to the guide's whole setup from a clean default: every knob,
    an empty queue (the old workload's requests cancelled), an empty prefix cache, the
    scenario, the requests in flight and the rate. Returns the knob names skipped."""
    fixed = getattr(source, "knob", None)
    _, skipped = split_knobs(guide, fixed)
    if guide.routing:       # first: one engine refuses it before anything changes
        source.set_routing_policy(guide.routing)
    source.set_knobs(**clean_knobs(guide, fixed))
    cancel = getattr(source, "cancel_workload", None)
    if cancel is not None:
        cancel()
    source.clear_prefix_cache()
    source.set_scenario(guide.scenario)
    source.set_concurrency(guide.concurrency or 16)
    source.set_rate(guide.rate)
    return skipped


def setup_of(guide: Guide, fixed: str | None = None) -> dict:
    """Every live knob and the workload a guide sets: what the engine runs under it."""
    routing = {"routing": guide.routing} if guide.routing else {}
    return {**clean_knobs(guide, fixed), "scenario": guide.scenario,
            "concurrency": guide.concurrency or 16, "rate": guide.rate, **routing}


def turn_hint(guide: Guide) -> str | None:
    """How to turn the guide's setup into its versus setup by hand, when one knob or
    workload value tells them apart (None: they differ in more): the key that does it in
    one press, else the palette's typed value."""
    versus = find(guide.versus)
    if versus is None:
        return None
    mine, theirs = setup_of(guide), setup_of(versus)
    diff = [k for k in mine if mine[k] != theirs[k]]
    if len(diff) != 1:
        return None
    name, value = diff[0], theirs[diff[0]]
    shown = ("on" if value else "off") if isinstance(value, bool) else value
    key = one_press(name, mine[name], value)
    return f"{key} ({name} {shown})" if key else f"ctrl+p {name} {shown}"


def one_press(name: str, old, new) -> str | None:
    """The key that turns knob `name` from `old` to `new` in one press, if one does."""
    from roseplay.tui.keys import KEYS
    if name == "routing":       # u / U cycle the router's policies
        i, n = ROUTING_POLICIES.index(old), len(ROUTING_POLICIES)
        step = {ROUTING_POLICIES[(i + 1) % n]: "u", ROUTING_POLICIES[(i - 1) % n]: "U"}
        return step.get(new)
    f = next((f for f in knob_fields(SchedulerConfig) if f.name == name), None)
    if f is None:
        return None
    choices = list(f.metadata.get("choices") or ())
    for k in (k for k in KEYS if k.knob == name):
        if k.action == "toggle_cache" and isinstance(old, bool):
            return k.display
        if "cycle_knob" in k.action and old in choices:
            step = 1 if k.action.endswith(", 1)") else -1
            if choices[(choices.index(old) + step) % len(choices)] == new:
                return k.display
    return None


def describe(guide: Guide) -> str:
    setup = ", ".join(f"{k}={v}" for k, v in guide.knobs.items()) or "default knobs"
    text = (f"{guide.scenario}, {setup} (others default), {guide.concurrency or 16} in "
            f"flight" + (f", {guide.rate:g} req/s" if guide.rate else ""))
    if guide.routing:
        text += (f", routing {guide.routing}; needs roseplay --data-parallel-size 2; "
                 f"against {find(guide.versus).routing}")
    if guide.compare:
        text += f"; side by side: roseplay --compare {guide.compare} --scenario {guide.scenario}"
        if guide.concurrency not in (None, APP_CONCURRENCY):    # not the app's default
            text += f" --concurrency {guide.concurrency}"
    return text

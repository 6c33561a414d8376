"""The policy knobs alone (no model): each one's defining behaviour, and the KV-block
residency metrics against hand-computed values. Greedy outputs under every policy:
tests/engine/core/test_scheduler.py."""
import math

import pytest

from engine.config import InvalidRequestError, SchedulerConfig
from engine.kv_metrics import RESIDENCY_BUCKETS, Histogram
from engine.core.kv.block_pool import BlockPool
from engine.request import Request, SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.kv.counters import Counters
from tests.helpers import add_request

BS = 4


def req(rid, tokens, max_tokens=8, priority=0, arrival=0.0):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0),
                   arrival_time=arrival, priority=priority)


def make(num_blocks=32, budget=64, seqs=8, **knobs):
    counters = Counters()
    pool = BlockPool(num_blocks, BS, counters)
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, **knobs)
    return Scheduler(config, pool, counters), pool


def step(sched, token=3):
    """Schedule, compute the plan, and give every request that sampled a token."""
    plan = sched.schedule()
    for c in plan.chunks:
        c.request.num_computed_tokens += c.num_tokens
        sched.kv.register_full_blocks(c.request, sched.knobs.enable_prefix_caching)
        if c.sample:
            sched.leader_sampled(c.request)
            c.request.output_token_ids.append(token)
    return plan


def ids(chunks):
    return [c.request.request_id for c in chunks]


def decoding(sched, *requests):
    """Admit and prefill the requests until every one of them decodes."""
    for r in requests:
        sched.add(r)
    while any(r.num_uncomputed != 1 for r in requests):
        step(sched)


def test_knob_choices_are_validated():
    with pytest.raises(InvalidRequestError, match="scheduling_mode must be one of"):
        SchedulerConfig(scheduling_mode="fastest")
    with pytest.raises(InvalidRequestError, match="eviction_policy"):
        SchedulerConfig().replace(eviction_policy="random")
    from engine.config import check_priority
    with pytest.raises(InvalidRequestError, match="priority"):
        check_priority(2 ** 40)
    with pytest.raises(InvalidRequestError, match="priority"):
        check_priority(True)


# -- step composition ----------------------------------------------------------------------
def test_prefill_first_never_mixes_prefill_and_decode():
    sched, pool = make(budget=8, scheduling_mode="prefill-first")
    decoding(sched, req("a", range(1, 6)), req("b", range(11, 16)))
    sched.add(req("c", range(21, 41)))           # 20 tokens: three prefill steps at budget 8
    kinds = []
    for _ in range(6):
        plan = step(sched)
        assert not (plan.prefills and plan.decodes)
        kinds.append("P" if plan.prefills else "D")
    assert kinds[:3] == ["P", "P", "P"] and kinds[3:] == ["D", "D", "D"]
    pool.check(sched.block_tables())


def test_budget_mode_mixes_and_rotates_decodes_within_the_budget():
    sched, _ = make()
    decoding(sched, *(req(f"r{i}", range(10 * i + 1, 10 * i + 4)) for i in range(3)))
    sched.knobs = sched.knobs.replace(max_num_batched_tokens=2)
    plan = step(sched)
    assert len(plan.decodes) == 2 and plan.num_tokens == 2          # 3 decodes take turns
    assert len(step(sched).decodes) == 2


def test_mixed_chunk_runs_every_decode_and_gives_prefill_the_rest():
    sched, _ = make(budget=8, scheduling_mode="mixed-chunk")
    decoding(sched, *(req(f"r{i}", range(10 * i + 1, 10 * i + 4)) for i in range(3)))
    sched.add(req("long", range(100, 120)))
    plan = step(sched)
    assert len(plan.decodes) == 3 and [c.num_tokens for c in plan.prefills] == [5]   # 8 - 3
    sched.knobs = sched.knobs.replace(max_num_batched_tokens=2)
    plan = step(sched)            # decodes use the whole budget: all 3 run, no prefill
    assert len(plan.decodes) == 3 and not plan.prefills and plan.num_tokens == 3


# -- queue order -----------------------------------------------------------------------------
def test_lpm_admits_the_longest_cached_prefix_first():
    system = list(range(1, 13))                   # 3 full blocks
    for policy, first in (("fcfs", "plain"), ("lpm", "cached")):
        sched, _ = make(seqs=2, scheduling_policy=policy)
        decoding(sched, req("warm", system + [50]))
        sched.add(req("plain", range(60, 74)))
        sched.add(req("half", system[:8] + [77, 78, 79, 80, 81]))
        sched.add(req("cached", system + [90, 91]))
        plan = step(sched)                        # one slot left
        assert ids(plan.prefills) == [first]


def test_priority_admits_lower_values_first():
    sched, _ = make(seqs=2, scheduling_policy="priority")
    for i, (rid, prio) in enumerate((("low", 5), ("high", -1), ("mid", 0))):
        sched.add(req(rid, range(10 * i + 1, 10 * i + 5), priority=prio, arrival=i))
    assert ids(step(sched).prefills) == ["high", "mid"]


@pytest.mark.parametrize("policy,victim", [("fcfs", "new"), ("priority", "unimportant")])
def test_priority_preempts_the_lowest_priority_not_the_newest(policy, victim):
    sched, pool = make(num_blocks=6, scheduling_policy=policy)
    rs = [req("old", range(1, 8), 20, priority=0, arrival=0.0),
          req("unimportant", range(11, 18), 20, priority=9, arrival=1.0),
          req("new", range(21, 28), 20, priority=1, arrival=2.0)]
    decoding(sched, *rs)                          # 2 blocks each: the pool is full
    for r in rs:                                  # every one now needs a third block
        r.output_token_ids.append(4)
    plan = sched.schedule()
    assert [r.request_id for r, _ in plan.preempted][0] == victim
    pool.check(sched.block_tables())


# -- eviction --------------------------------------------------------------------------------
def _cached_pool(policy):
    pool = BlockPool(3, BS, Counters())
    pool.eviction_policy = policy
    a, b = pool.allocate(2)
    pool.index.insert(b"a", a)
    pool.index.insert(b"b", b)
    pool.release([a])                             # a released first: lru evicts it first
    pool.touch([a])                               # ... but a is hit twice
    pool.release([a])
    pool.touch([a])
    pool.release([a])
    pool.release([b])
    return pool, a, b


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_eviction_policy_picks_its_victim(policy):
    pool, a, b = _cached_pool(policy)
    pool.allocate(1)                              # the free block
    got = pool.allocate(1)
    assert got == ([a] if policy == "lru" else [b])       # lfu keeps the block with hits
    pool.check([[2], got])


def test_eviction_policy_switches_live():
    pool, a, b = _cached_pool("lru")
    pool.eviction_policy = "lfu"                  # the heap is built from the cached set
    assert pool.allocate(2)[-1] == b and pool.allocate(1) == [a]


def test_hot_scan_scenario_separates_lfu_from_lru():
    """The hot-scan scenario on a pool its scans overflow: under lru the hot prompt is
    evicted during every scan (the first hot request after a scan misses), under lfu it
    stays cached (every hot request after the very first hits); outputs are equal."""
    from engine import LLM
    from roseplay.workload.scenarios import HOT_RUN, SCAN_RUN, build_workload
    items = build_workload("hot-scan", 3 * (HOT_RUN + SCAN_RUN), vocab_size=512, input_len=64,
                           output_len=4, seed=0)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    hits, outputs = {}, {}
    for policy in ("lru", "lfu"):
        llm = LLM(model="dummy:tiny", device="cpu", num_blocks=64, eviction_policy=policy)
        hits[policy], outputs[policy] = [], []
        for item in items:            # one at a time: the release order is the item order
            out = llm.generate([item.prompt], params)[0]
            outputs[policy].append(out.outputs[0].token_ids)
            if item.tag == "hot":
                hits[policy].append(out.metrics.num_cached_tokens > 0)
    assert hits["lfu"] == [False] + [True] * 5
    assert hits["lru"] == [False, True] * 3
    assert outputs["lru"] == outputs["lfu"]


# -- residency metrics ------------------------------------------------------------------------
class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_block_lifetime_idle_and_reuse_gaps_by_hand():
    clock = Clock()
    pool = BlockPool(2, BS, Counters())
    pool.clock = clock
    a, b = pool.allocate(2)                       # both born at t=0
    pool.index.insert(b"a", a)
    pool.index.insert(b"b", b)
    pool.release([a, b])
    for t in (1.0, 2.0, 4.0, 7.0, 11.0):          # a: 5 hits, the last 4 are kept
        clock.t = t
        pool.touch([a])
        pool.release([a])
    clock.t = 20.0
    pool.allocate(2)                              # evicts both
    m = pool.lifetimes.freeze()
    assert (m.lifetime.count, m.lifetime.sum) == (2, 40.0)            # 20 + 20
    assert (m.idle_before_evict.count, m.idle_before_evict.sum) == (2, 9.0 + 20.0)
    assert (m.reuse_gap.count, m.reuse_gap.sum) == (3, 2.0 + 3.0 + 4.0)   # 2,4,7,11
    le = dict(zip(RESIDENCY_BUCKETS, m.reuse_gap.counts))
    assert (le[2.0], le[5.0]) == (1, 2)           # 2 in (1, 2]; 3 and 4 in (2, 5]
    assert m.lifetime.counts[RESIDENCY_BUCKETS.index(20.0)] == 2


def test_a_large_pool_samples_one_block_in_stride_but_counts_every_hit():
    """Past MAX_TRACKED blocks, residency samples come from block ids divisible by the
    stride (vLLM samples 1%); hit counts stay exact for every block (lfu reads them)."""
    from engine.core.kv.block_metrics import MAX_TRACKED, BlockLifetimes
    life = BlockLifetimes(3 * MAX_TRACKED)
    assert life.stride == 3
    life.on_allocated([3, 4], 1.0)
    life.on_hit(4, 2.0)
    life.on_hit(3, 5.0)
    life.on_evicted([3, 4], 10.0)
    m = life.freeze()
    assert (m.lifetime.count, m.lifetime.sum) == (1, 9.0)             # block 3 only
    assert (m.idle_before_evict.count, m.idle_before_evict.sum) == (1, 5.0)
    assert life.num_hits[3] == life.num_hits[4] == 1
    assert BlockLifetimes(MAX_TRACKED).stride == 1


def test_histogram_quantile_interpolates_like_prometheus():
    counts = [0] * (len(RESIDENCY_BUCKETS) + 1)
    counts[RESIDENCY_BUCKETS.index(10.0)] = 2     # two samples in (5, 10]
    counts[RESIDENCY_BUCKETS.index(20.0)] = 2     # two in (10, 20]
    h = Histogram(RESIDENCY_BUCKETS, tuple(counts), 50.0, 4)
    assert h.quantile(0.5) == 10.0                # rank 2: the top of (5, 10]
    assert h.quantile(0.25) == 7.5                # rank 1: halfway through (5, 10]
    assert h.quantile(0.75) == 15.0
    assert h.mean == 12.5 and math.isnan(Histogram().quantile(0.5))
    assert h.minus(h).count == 0


@pytest.mark.parametrize("seed", [17, 80, 93, 96, 105])
def test_prefill_first_drains_a_full_pool(seed):
    """Regression (found by the state machine in CI): under prefill-first a prefill that
    preempted to grow was re-admitted at once, so every step was prefill-only and the
    running decodes starved forever. Random small pools, tiny budgets, every policy."""
    import random
    from tests.engine.core.kv_checking import VOCAB, make_engine
    rng = random.Random(seed)
    nb, bsz = rng.randint(3, 8), rng.choice([4, 8])
    eng = make_engine(nb, bsz, enable_prefix_caching=rng.random() < .5,
                      max_num_batched_tokens=rng.choice([1, 2, 64, 512]),
                      max_num_seqs=rng.choice([1, 2, 8]))
    for i in range(rng.randint(1, 8)):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=0, ignore_eos=True)
        try:
            add_request(eng, {"prompt_token_ids": prompt}, params, request_id=f"r{i}",
                        priority=rng.randint(-2, 2))
        except InvalidRequestError:
            pass
    knobs = dict(scheduling_mode="prefill-first",
                 scheduling_policy=rng.choice(["fcfs", "priority", "lpm"]),
                 eviction_policy=rng.choice(["lru", "lfu"]), max_num_seqs=rng.choice([1, 2, 8, 64]),
                 max_num_batched_tokens=rng.choice([1, 2, 64, 512]))
    eng.set_knobs(eng.knobs.replace(**knobs))
    for _ in range(3000):
        if not eng.has_unfinished():
            break
        eng.step()
    assert not eng.has_unfinished(), "prefill-first livelocked"
    eng.pool.check([])

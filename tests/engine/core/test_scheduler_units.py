"""BlockPool, PrefixCache, KVManager and Scheduler alone: no model, no runner."""
import gc
import struct

import pytest

from engine.codes import BLOCK_CACHED, BLOCK_FREE, BLOCK_USED
from engine.config import SchedulerConfig
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.prefix_cache import ROOT_HASH, PrefixCache, block_key, key_tokens
from engine.request import (PENDING_TOKEN, Request, RequestStatus, SamplingParams,
                            add_pending_tokens, append_sampled)
from engine.core.launched import commit_plan
from engine.core.scheduler import Scheduler
from engine.core.kv.counters import Counters

BS = 4


def req(rid, tokens, max_tokens=4):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0))


def make(num_blocks=16, budget=64, seqs=8, caching=True):
    counters = Counters()
    pool = BlockPool(num_blocks, BS, counters)
    knobs = SchedulerConfig(enable_prefix_caching=caching, max_num_batched_tokens=budget,
                            max_num_seqs=seqs)
    return Scheduler(knobs, pool, counters), pool, counters


def compute(sched, plan):
    """What the engine's commit does after a forward: advance and index full blocks."""
    for c in plan.chunks:
        c.request.num_computed_tokens += c.num_tokens
        sched.kv.register_full_blocks(c.request, sched.knobs.enable_prefix_caching)
        if c.sample:
            sched.leader_sampled(c.request)


def end(sched, *reqs):
    """What the engine does with the requests a step ends (LLMEngine._finish_all): each
    leaves the scheduler, then their blocks are freed together."""
    for r in reqs:
        sched.unlink(r)
        r.status = RequestStatus.FINISHED
    sched.kv.drop_all(reqs)


def test_pool_states_refcounts_and_lru_eviction():
    counters = Counters()
    pool = BlockPool(4, BS, counters)
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.num_free == 1 and list(pool.refcounts) == [1, 1, 1, 0]
    pool.index.insert(block_key(ROOT_HASH, [1]), a[0])
    pool.release(a)                       # tail first: block 0 (indexed) is cached last
    assert list(pool.states()) == [BLOCK_CACHED, BLOCK_FREE, BLOCK_FREE, BLOCK_FREE]
    assert pool.allocate(5) is None and pool.num_available == 4    # refused, nothing changed
    got = pool.allocate(4)                # the cached block is evicted last
    assert got[-1] == 0 and counters.evictions == 1 and pool.take_evicted() == [0]
    assert 0 not in pool.index and set(pool.states()) == {BLOCK_USED}
    pool.check([got])


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_one_release_caches_a_table_tail_first_and_frees_the_rest(policy):
    """A finishing request's table in one release: its unindexed blocks are free, its
    indexed ones evictable in release order, tail first (no hits: lfu ties break the
    same way); a block released once too often is refused."""
    pool = BlockPool(6, BS, Counters())
    pool.eviction_policy = policy
    table = pool.allocate(5)
    for b in (0, 1, 3):
        pool.index.insert(block_key(ROOT_HASH, [b]), table[b])
    pool.release(table)
    assert pool.num_cached == 3 and pool.num_free == 3
    assert list(pool.states()) == [BLOCK_CACHED, BLOCK_CACHED, BLOCK_FREE, BLOCK_CACHED,
                                   BLOCK_FREE, BLOCK_FREE]
    got = pool.allocate(6)              # free first (5, then the released 4, 2), then cached
    assert got == [5, 4, 2, 3, 1, 0] and pool.take_evicted() == [3, 1, 0]
    pool.check([got])
    pool.release(got)
    with pytest.raises(AssertionError, match="underflow"):
        pool.release([got[0]])


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_tables_released_together_as_one_at_a_time(policy):
    """release_tables (a step's ended requests, KVManager.drop_all) leaves the pool as
    releasing each table in turn: the same refcounts, free order and eviction order,
    a block shared by two tables freed at the second."""
    def pool_with_tables():
        pool = BlockPool(12, BS, Counters())
        pool.eviction_policy = policy
        a, b = pool.allocate(4), pool.allocate(3)
        pool.incref(a[0])                     # a prefix block both tables hold
        b = [a[0]] + b
        for block in (a[0], a[1], a[3], b[2]):
            pool.index.insert(block_key(ROOT_HASH, [block]), block)
        return pool, [a, b, pool.allocate(2)]

    one, tables = pool_with_tables()
    for table in tables:
        one.release(table)
    together, tables = pool_with_tables()
    together.release_tables(tables)
    assert list(together.refcounts) == list(one.refcounts) == [0] * 12
    assert list(together.states()) == list(one.states())
    assert list(together._free) == list(one._free)
    assert together.allocate(12) == one.allocate(12)       # free, then evicted in order
    evicted = one.take_evicted()
    assert together.take_evicted() == evicted and len(evicted) == 4


def test_prefix_cache_compares_exact_keys():
    cache = PrefixCache()
    key = block_key(ROOT_HASH, (1, 2, 3, 4))
    assert cache.insert(key, 7)
    assert not cache.insert(block_key(ROOT_HASH, [1, 2, 3, 4]), 8)   # first writer wins
    assert cache.get(block_key(ROOT_HASH, [1, 2, 3, 4])) == 7
    assert cache.get(block_key(ROOT_HASH, [9, 9, 9, 9])) is None
    assert cache.get(block_key(hash(key), [1, 2, 3, 4])) is None      # same tokens, other parent
    assert cache.get(block_key(ROOT_HASH, [1, 2, 3, 4 + (1 << 16)])) is None   # all bits count
    cache.remove(7)
    assert cache.get(key) is None and len(cache) == 0


def test_block_key_layout():
    """The parent's hash as int64 then the tokens as int32, little-endian, for any block
    size (one packer per size)."""
    for parent, tokens in ((ROOT_HASH, [1, 2, 3]), (-(1 << 63), [0] * 16),
                           (hash("x"), [2**31 - 1])):
        key = block_key(parent, tokens)
        assert key == struct.pack("<q", parent) + struct.pack(f"<{len(tokens)}i", *tokens)
        assert key_tokens(key) == tokens


def test_prefix_index_holds_nothing_the_garbage_collector_tracks():
    """Its dicts hold ints and bytes only: a GPU's 340k-block index adds nothing to walk."""
    cache = PrefixCache()
    parent = ROOT_HASH
    for block in range(64):
        key = block_key(parent, range(block * 16, block * 16 + 16))
        assert cache.insert(key, block)
        parent = hash(key)
    assert not gc.is_tracked(cache._block_of) and not gc.is_tracked(cache.key_of)


def test_budget_chunks_a_long_prompt_fifo_without_overtaking():
    sched, pool, _ = make(budget=8)
    long, short = req("long", range(1, 21)), req("short", [5, 6])
    sched.add(long)
    sched.add(short)
    plan = sched.schedule()
    assert [(c.request.request_id, c.start, c.num_tokens) for c in plan.prefills] == [("long", 0, 8)]
    compute(sched, plan)
    plan = sched.schedule()               # the running chunked prefill goes first
    assert [(c.request.request_id, c.num_tokens) for c in plan.prefills] == [("long", 8)]
    compute(sched, plan)
    plan = sched.schedule()               # 4 left for long, then short gets the rest
    assert [(c.request.request_id, c.num_tokens, c.sample) for c in plan.prefills] == \
        [("long", 4, True), ("short", 2, True)]
    pool.check(sched.block_tables())


def test_prefix_hit_and_dedup_join_count_once():
    sched, pool, counters = make()
    first = req("a", range(1, 11))
    sched.add(first)
    compute(sched, sched.schedule())      # 2 full blocks indexed
    end(sched, first)
    b, c = req("b", range(1, 11)), req("c", range(1, 11))
    c.prompt_token_ids = tuple(c.prompt_token_ids)   # as LLMEngine.add keeps a submitted
    sched.add(b)                                     # prompt: the same dedup key
    sched.add(c)
    plan = sched.schedule()
    assert plan.prefix_hits == [("b", (0, 1))] and b.num_cached_tokens == 8
    assert plan.dedup_joins == [("c", "b")] and c.dedup_leader is b
    assert counters.prefix_hits == 1 and counters.dedup_joined == 1
    compute(sched, plan)                  # the leader samples: its follower shares its blocks
    assert c.block_table == b.block_table and all(pool.refcounts[x] == 2 for x in b.block_table)
    pool.check(sched.block_tables())


def test_pool_dry_preempts_the_newest_and_requeues_it_first():
    sched, pool, counters = make(num_blocks=4, budget=64)
    old, new = req("old", range(1, 9), 20), req("new", range(11, 19), 20)
    sched.add(old)
    sched.add(new)
    compute(sched, sched.schedule())      # 2 + 2 blocks: the pool is full
    for r in (old, new):
        r.output_token_ids.append(3)
    plan = sched.schedule()               # old's next token needs a third block
    assert [r.request_id for r, _ in plan.preempted] == ["new"]
    assert new.status is RequestStatus.WAITING and sched.waiting[0] is new
    assert counters.preemptions == 1 and new.num_preemptions == 1
    pool.check(sched.block_tables())


def test_one_pass_decode_scheduling_preempts_a_request_it_has_not_reached():
    """Every decode fits the budget, so one pass over the running requests schedules
    them: the first one's next block preempts the newest, which the pass then skips (it
    is waiting, not a decode), and the one between still gets the freed block."""
    sched, pool, counters = make(num_blocks=6, budget=64)
    a, b, c = (req(n, range(10 * i + 1, 10 * i + 9), 20) for i, n in enumerate("abc"))
    for r in (a, b, c):
        sched.add(r)
    compute(sched, sched.schedule())      # 3 x 2 blocks: the pool is full
    for r in (a, b, c):
        r.output_token_ids.append(3)
    plan = sched.schedule()               # each decode's slot is in a third block
    assert [(ch.request.request_id, ch.start) for ch in plan.decodes] == [("a", 8), ("b", 8)]
    assert [r.request_id for r, _ in plan.preempted] == ["c"] and not plan.prefills
    assert c.status is RequestStatus.WAITING and sched.running == [a, b]
    assert counters.preemptions == 1
    pool.check(sched.block_tables())


def test_pool_refcounts_are_one_array_seen_two_ways():
    """BlockPool.refs (per-block reads and writes) and .refcounts (numpy, whole-pool
    operations) share their memory: a change through either shows in the other."""
    pool = BlockPool(4, BS)
    blocks = pool.allocate(2)
    pool.incref(blocks[1])
    assert list(pool.refcounts) == [1, 2, 0, 0] and list(pool.refs) == [1, 2, 0, 0]
    pool.release(blocks)
    assert (pool.refcounts == [0, 1, 0, 0]).all() and pool.refs[1] == 1
    pool.check([[blocks[1]]])


def test_pending_tokens_plan_the_next_step_and_leave_length_finishers_out():
    """Async scheduling: requests whose tokens are still on the device are planned with
    them (decode at the pending position, its slot reserved); one that the pending token
    ends by length is left out; admissions still happen in the same step."""
    sched, pool, _ = make()
    a, b = req("a", [1, 2, 3], max_tokens=5), req("b", [4, 5, 6], max_tokens=2)
    sched.add(a)
    sched.add(b)
    compute(sched, sched.schedule())
    for r in (a, b):
        r.output_token_ids.append(9)
    plan = sched.schedule()
    compute(sched, plan)
    add_pending_tokens([a, b])                # the step in flight samples their 2nd token
    sched.add(req("c", [7, 8]))
    nxt = sched.schedule()
    assert [(c.request.request_id, c.start) for c in nxt.decodes] == [("a", 4)]
    assert [(c.request.request_id, c.num_tokens) for c in nxt.prefills] == [("c", 2)]
    assert len(a.block_table) * BS >= 5 and a.num_uncomputed == 1
    assert (a.pending_row, b.pending_row) == (0, 1)
    assert append_sampled([a], [11], 0.0, [], [], []) == []
    assert a.output_token_ids == [9, 11] and a.pending_row == -1 and not a.num_pending


def test_commit_of_a_decode_only_step_counts_its_pending_tokens_in_the_same_pass():
    """Async scheduling: the commit of a plan of decodes alone (row i samples decode i)
    also counts each row's token as pending, as add_pending_tokens would; rows that are
    not the decodes one to one (a dedup follower's row) leave that to the caller."""
    sched, pool, _ = make()
    a, b = req("a", [1, 2, 3], max_tokens=8), req("b", [4, 5, 6], max_tokens=8)
    for r in (a, b):
        sched.add(r)
    compute(sched, sched.schedule())
    for r in (a, b):
        r.output_token_ids.append(9)
    plan = sched.schedule()
    assert commit_plan(plan, sched, BS, True, rows=[a, b])
    assert [(r.num_computed_tokens, r.output_token_ids, r.pending_row) for r in (a, b)] \
        == [(4, [9, PENDING_TOKEN], 0), (4, [9, PENDING_TOKEN], 1)]
    nxt = sched.schedule()                  # planned with the pending tokens
    assert [(c.request.request_id, c.start) for c in nxt.decodes] == [("a", 4), ("b", 4)]
    follower = req("f", [1, 2, 3])
    assert not commit_plan(nxt, sched, BS, True, rows=[a, follower, b])
    assert [(r.num_computed_tokens, r.pending_row) for r in (a, b)] == [(5, 0), (5, 1)]


def test_a_preempted_request_waits_for_its_pending_token():
    """Its token is not known yet: re-admitting it would prefill a placeholder."""
    sched, pool, _ = make(num_blocks=16)
    r = req("r", [1, 2, 3], max_tokens=8)
    sched.add(r)
    compute(sched, sched.schedule())
    add_pending_tokens([r])
    sched.preempt(r)
    assert not sched.schedule() and sched.waiting[0] is r
    append_sampled([r], [5], 0.0, [], [], [])     # planned with it: resolves, though preempted
    plan = sched.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in plan.prefills] == [("r", 4)]


@pytest.mark.parametrize("knob", ["max_num_batched_tokens", "max_num_seqs"])
def test_knobs_have_an_upper_bound(knob):
    from engine.config import KNOB_MAXIMUM, InvalidRequestError
    assert getattr(SchedulerConfig(**{knob: KNOB_MAXIMUM[knob]}), knob) == KNOB_MAXIMUM[knob]
    with pytest.raises(InvalidRequestError, match=knob):
        SchedulerConfig(**{knob: 10 ** 30})


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=float("inf")), "temperature must be in"),
    (dict(stop=["x"] * 65), "at most 64 strings"),
    (dict(stop=["y" * 1025]), "at most 1024 characters"),
])
def test_sampling_params_bound_the_work_a_request_can_ask_for(kw, match):
    from engine.config import InvalidRequestError
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kw)

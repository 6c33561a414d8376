"""The TTFT split's timestamps (engine/request.py, vLLM's scheduled_ts and queued_time):
the scheduler stamps a request's first admission and the scheduling of its last prompt
chunk on the serving clock; the three parts add up to TTFT; a preemption keeps the
first admission (its requeue and recompute count in the prefill part, as in vLLM); a
dedup follower computes no chunk; the steps record the budget and mode they were
planned under. Scheduler alone with a ticking clock, then a dummy engine."""
import math

import pytest

from engine.config import SchedulerConfig, make_config
from engine.core.core import LLMEngine
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.core.scheduler import Scheduler
from engine.request import Request, SamplingParams, append_sampled
from engine.snapshot import ttft_split
from tests.helpers import add_request

BS = 4


class Clock:
    """The serving clock, set by the test (the pool reads it for block lifetimes too)."""
    t = 0.0

    def __call__(self) -> float:
        return self.t


def _sched(budget=8, caching=False, num_blocks=32):
    counters = Counters()
    pool = BlockPool(num_blocks, BS, counters)
    pool.clock = Clock()
    knobs = SchedulerConfig(enable_prefix_caching=caching, max_num_batched_tokens=budget,
                            max_num_seqs=8)
    return Scheduler(knobs, pool, counters)


def _step(sched, t):
    """Plan a step at time t and compute it."""
    sched.pool.clock.t = t
    _compute(sched, sched.schedule())


def _req(rid, n=20):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=4, temperature=0),
                   arrival_time=0.0)


def _compute(sched, plan):
    for c in plan.chunks:
        c.request.num_computed_tokens += c.num_tokens
        sched.kv.register_full_blocks(c.request, sched.knobs.enable_prefix_caching)
        if c.sample:
            sched.leader_sampled(c.request)


def _emit(req, token, now):
    append_sampled([req], [token], now, [], [], [])


def test_first_admission_counts_and_chunks_add_up_across_a_preemption():
    sched = _sched(budget=8)
    r = _req("a", 20)
    sched.add(r)
    _step(sched, 1.0)                              # chunk 1 (0:8)
    assert (r.scheduled_ts, r.prefill_chunks, r.last_chunk_ts) == (1.0, 1, None)
    sched.preempt(r)                               # before its first token
    for t in (2.0, 3.0, 4.0):                      # recompute: 0:8, 8:16, 16:20
        _step(sched, t)
    assert r.scheduled_ts == 1.0                   # vLLM: a preemption does not move it
    assert r.prefill_chunks == 4 and r.prefill_preemptions == 1
    assert r.last_chunk_ts == 4.0
    _emit(r, 7, now=5.0)
    sched.preempt(r)                               # after its first token: not prefill
    _step(sched, 6.0)
    assert (r.prefill_chunks, r.prefill_preemptions, r.last_chunk_ts) == (4, 1, 4.0)
    assert ttft_split(r.arrival_time, 5.0, r.scheduled_ts, r.last_chunk_ts) == (1.0, 3.0, 1.0)


def test_a_dedup_follower_computes_no_chunk():
    sched = _sched(budget=64, caching=True)
    leader, follower = _req("l", 12), _req("f", 12)
    sched.add(leader)
    sched.add(follower)
    sched.pool.clock.t = 2.0
    plan = sched.schedule()
    assert plan.dedup_joins == [("f", "l")]
    assert leader.prefill_chunks == 1 and leader.last_chunk_ts is not None
    assert follower.scheduled_ts is not None and follower.prefill_chunks == 0
    assert follower.last_chunk_ts is None and follower.scheduled_ts == 2.0
    assert ttft_split(0.0, 9.0, follower.scheduled_ts, None) == (2.0, 7.0, 0.0)


def test_the_plan_carries_its_budget_and_mode():
    sched = _sched(budget=8)
    sched.knobs = sched.knobs.replace(scheduling_mode="prefill-first")
    sched.add(_req("a", 20))
    plan = sched.schedule()
    assert (plan.budget, plan.mode) == (8, "prefill-first")


@pytest.fixture(scope="module")
def served():
    """Two 40-token prompts, one seat, a budget of 16: b waits for all of a."""
    eng = LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                                num_blocks=64, block_size=8, max_num_batched_tokens=16,
                                max_num_seqs=1, enable_prefix_caching=False))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    reqs = [add_request(eng, {"prompt_token_ids": list(range(k, k + 40))}, params, rid)
            for k, rid in ((1, "a"), (2, "b"))]
    while eng.has_unfinished():
        eng.step()
    eng.flush()
    yield eng, reqs, eng.snapshot()
    eng.close()


def test_the_parts_add_up_to_ttft_in_order(served):
    eng, (a, b), snap = served
    for r in (a, b):
        assert r.arrival_time <= r.scheduled_ts <= r.last_chunk_ts < r.token_times[0]
        assert r.prefill_chunks == math.ceil(40 / 16) and r.prefill_preemptions == 0
        view = snap.request(r.request_id)
        queued, prefill, last = view.ttft_split()
        assert queued == pytest.approx(r.scheduled_ts - r.arrival_time, abs=1e-9)
        assert prefill == pytest.approx(r.last_chunk_ts - r.scheduled_ts, abs=1e-9)
        assert last == pytest.approx(r.token_times[0] - r.last_chunk_ts, abs=1e-9)
        assert queued + prefill + last == pytest.approx(view.ttft, abs=1e-9)
        assert view.queued_time == pytest.approx(queued, abs=1e-12)
        assert view.prefill_chunks == 3
    # one seat: b is scheduled only once a is done (its queue holds a's whole service)
    assert b.scheduled_ts > a.token_times[-1]
    parts = {round(t, 9): p for t, *p in snap.recent_ttft_parts}
    for r in (a, b):
        assert parts[round(r.token_times[-1], 9)] == pytest.approx(
            list(snap.request(r.request_id).ttft_split()), abs=1e-9)


def test_steps_record_the_budget_and_mode(served):
    _, _, snap = served
    assert {(s.budget, s.mode) for s in snap.recent_steps} == {(16, "budget")}
    assert max(s.prefill_tokens + s.decode_tokens for s in snap.recent_steps) <= 16

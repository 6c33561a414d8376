"""Stateful property test of the block pool + prefix cache + scheduler + engine update.

A hypothesis RuleBasedStateMachine submits random requests (random lengths, shared
prefixes, identical prompts, earlier prompts extended by their outputs), steps, cancels,
flips the live knobs (prefix caching, token budget, max_num_seqs, preemption by recompute
or swap) and clears the prefix cache, on pools of 3..24 blocks of 1..8 tokens, with or
without a host tier of 2..24 blocks, with async scheduling on or off and
speculative decoding (a drafter that proposes the right continuation with a drawn chance,
else a wrong token; k changed live). Cancels pick any request, or a dedup leader whose
followers wait on its logits (with async scheduling: while its last chunk is in flight).
After every rule it checks the invariants of DESIGN.md, and more:

- every block is in exactly one of free / used / cached; refcount == the number of
  block tables holding it (the index holds no reference; BlockPool.check); the same in
  the host tier, where a block's holders are swapped-out requests' records, and nothing
  is in flight between steps (HostTier.check); a running request holds no swap record;
- waiting requests and dedup followers hold no blocks;
- KV integrity: the model is replaced by `KVCheckingRunner`, which keeps the *token id*
  written in every KV slot; each forward writes its chunk into the slots the scheduler
  gave it (asserting the block is not shared: copy-on-write happened), then reads the
  whole context back through the block table and asserts it equals the request's
  tokens (so a wrong prefix hit, a missed COW copy or a block reused while still
  referenced fails at once); every indexed block still holds the tokens of its key, in
  both tiers (the host tier's copies move the token ids: a block offloaded, reloaded or
  swapped to the wrong place fails the next read);
- outputs: the runner's logits are a one-hot of a deterministic function of the
  context, so every finished request must produce exactly the tokens (and finish
  reason) that its solo run predicts, and a cancelled one a prefix of them, and no
  step fails (a failed step errs its requests: the last error is checked);
- requests are refused (InvalidRequestError) iff they can never fit the pool;
- at the end, everything drains (no livelock) and, after clearing the prefix cache,
  every block of both tiers is free.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from engine.config import (EVICTION_POLICIES, PREEMPTION_MODES, SCHEDULING_MODES,
                           SCHEDULING_POLICIES, InvalidRequestError)
from engine.request import SamplingParams
from tests.conftest import run_slow
from tests.engine.core.kv_checking import (MAX_MODEL_LEN, VOCAB, OracleDrafter, check_all,
                                           expected, make_engine)
from tests.helpers import add_request


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.eng = None
        self.reqs = {}        # id -> (Request, expected tokens, expected reason)
        self.prompts = []
        self.n = 0

    @initialize(num_blocks=st.integers(3, 24), block_size=st.sampled_from([1, 2, 4, 8]),
                caching=st.booleans(), budget=st.sampled_from([1, 3, 8, 32, 512]),
                seqs=st.sampled_from([1, 2, 4, 64]), async_=st.sampled_from([True, True, False]),
                k=st.sampled_from([0, 0, 1, 3]), accept=st.sampled_from([0.0, 0.6, 1.0]),
                seed=st.integers(0, 2 ** 16), host=st.sampled_from([0, 0, 2, 6, 24]),
                preemption=st.sampled_from(PREEMPTION_MODES))
    def setup(self, num_blocks, block_size, caching, budget, seqs, async_, k, accept, seed,
              host, preemption):
        self.eng = make_engine(num_blocks, block_size, host_blocks=host,
                               enable_prefix_caching=caching, preemption_mode=preemption,
                               max_num_batched_tokens=budget, max_num_seqs=seqs,
                               async_scheduling=async_, num_speculative_tokens=k,
                               proposer=OracleDrafter(accept, seed))

    # -- requests ---------------------------------------------------------------------------
    def _submit(self, prompt, max_tokens, ignore_eos, data, stops=None):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos,
                                stop_token_ids=sorted(stops or ()))
        eng = self.eng
        need = min(len(prompt) + max_tokens, MAX_MODEL_LEN)
        capacity = eng.pool.num_blocks * eng.pool.block_size
        if len(prompt) >= MAX_MODEL_LEN or need > capacity:
            with pytest.raises(InvalidRequestError):
                add_request(eng, {"prompt_token_ids": prompt}, params)
            return
        rid = f"r{self.n}"
        self.n += 1
        req = add_request(eng, {"prompt_token_ids": prompt}, params, request_id=rid,
                          priority=data.draw(st.integers(-2, 2)))   # scheduling_policy=priority
        self.reqs[rid] = (req, *expected(prompt, params, eng.eos_token_ids))
        self.prompts.append(prompt)

    @rule(n=st.integers(1, 40), max_tokens=st.integers(1, 12), ignore_eos=st.booleans(),
          copies=st.integers(1, 4), stops=st.none() | st.sets(st.integers(0, VOCAB - 1),
                                                              max_size=60), data=st.data())
    def submit_fresh(self, n, max_tokens, ignore_eos, copies, stops, data):
        """A new prompt, maybe several identical copies at once (same-step dedup + COW),
        maybe with stop token ids (finish reason "stop" mid-way)."""
        prompt = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
        for _ in range(copies):
            self._submit(prompt, max_tokens, ignore_eos, data, stops)

    @precondition(lambda self: self.prompts)
    @rule(max_tokens=st.integers(1, 12), data=st.data())
    def submit_identical(self, max_tokens, data):
        prompt = data.draw(st.sampled_from(self.prompts))
        self._submit(list(prompt), max_tokens, True, data)

    @precondition(lambda self: self.prompts)
    @rule(max_tokens=st.integers(1, 12), keep=st.floats(0, 1), extra=st.integers(0, 12),
          data=st.data())
    def submit_shared_prefix(self, max_tokens, keep, extra, data):
        base = data.draw(st.sampled_from(self.prompts))
        suffix = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=extra, max_size=extra))
        prompt = list(base[:max(1, int(len(base) * keep))]) + suffix
        self._submit(prompt, max_tokens, True, data)

    @precondition(lambda self: any(r.output_token_ids for r, _, _ in self.reqs.values()))
    @rule(max_tokens=st.integers(1, 8), extra=st.integers(0, 5), data=st.data())
    def submit_follow_up(self, max_tokens, extra, data):
        """A multi-turn continuation: an earlier prompt + its output + a little more."""
        req = data.draw(st.sampled_from([r for r, _, _ in self.reqs.values()
                                         if r.output_token_ids]))
        suffix = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=extra, max_size=extra))
        self._submit(req.all_token_ids() + suffix, max_tokens, True, data)

    # -- engine -------------------------------------------------------------------------------
    @rule(k=st.integers(1, 10))
    def step(self, k):
        for _ in range(k):
            self.eng.step()
            check_all(self.eng)

    @precondition(lambda self: self.eng is not None and self.eng.requests)
    @rule(data=st.data())
    def cancel(self, data):
        self.cancel_one(data.draw(st.sampled_from(sorted(self.eng.requests))))

    def cancel_one(self, rid):
        req = self.eng.abort(rid)
        assert req.finish_reason == "cancelled" and not req.block_table

    @precondition(lambda self: self.eng is not None and self.eng.scheduler.followers)
    @rule(data=st.data(), k=st.integers(0, 2))
    def cancel_leader(self, data, k):
        """Cancel a dedup leader (its followers go back to the queue), after k steps:
        with k = 0 and async scheduling, its last prefill chunk may still be in flight,
        the followers' sample rows with it."""
        for _ in range(k):
            self.eng.step()
        leaders = sorted(r.request_id for r in self.eng.scheduler.followers)
        if leaders:
            self.cancel_one(data.draw(st.sampled_from(leaders)))

    @rule(caching=st.none() | st.booleans(),
          budget=st.none() | st.sampled_from([1, 2, 3, 5, 8, 16, 64, 512]),
          seqs=st.none() | st.sampled_from([1, 2, 3, 8, 64]),
          mode=st.none() | st.sampled_from(SCHEDULING_MODES),
          policy=st.none() | st.sampled_from(SCHEDULING_POLICIES),
          eviction=st.none() | st.sampled_from(EVICTION_POLICIES),
          spec_k=st.none() | st.integers(0, 3),
          preemption=st.none() | st.sampled_from(PREEMPTION_MODES))
    def set_knobs(self, caching, budget, seqs, mode, policy, eviction, spec_k, preemption):
        """Live knob flips: prefix caching, token budget, max_num_seqs, the policies, the
        speculative k and the preemption mode (any subset)."""
        changes = {k: v for k, v in dict(enable_prefix_caching=caching,
                                         max_num_batched_tokens=budget,
                                         max_num_seqs=seqs, scheduling_mode=mode,
                                         scheduling_policy=policy,
                                         eviction_policy=eviction,
                                         num_speculative_tokens=spec_k,
                                         preemption_mode=preemption).items() if v is not None}
        self.eng.set_knobs(self.eng.knobs.replace(**changes))

    @rule()
    def clear_cache(self):
        self.eng.clear_prefix_cache()
        assert self.eng.pool.num_cached == 0 and len(self.eng.pool.index) == \
            len([b for b in self.eng.pool.index.blocks() if self.eng.pool.refcounts[b] > 0])

    # -- checks -------------------------------------------------------------------------------
    @invariant()
    def invariants_hold(self):
        if self.eng is not None:
            check_all(self.eng)
            self._check_outputs()

    def _check_outputs(self):
        for rid, (req, want, reason) in self.reqs.items():
            got = req.output_token_ids
            assert got == want[:len(got)], f"{rid}: {got} is not a prefix of {want}"
            if req.finish_reason in ("length", "stop"):
                assert (got, req.finish_reason) == (want, reason), rid
            if not req.status.done:
                assert len(got) < len(want)

    def teardown(self):
        eng = self.eng
        if eng is None:
            return
        # (teardown also runs after a failed rule: repeat the root cause, not a symptom)
        assert not eng.executor.runner.violations, eng.executor.runner.violations[0]
        assert eng.stats.last_error is None, eng.stats.last_error
        # everything drains: no livelock, whatever the knobs were left at
        limit = 20 + 4 * sum(MAX_MODEL_LEN for _ in eng.requests) * max(
            1, 64 // eng.knobs.max_num_batched_tokens)
        for _ in range(limit):
            if not eng.has_unfinished():
                break
            eng.step()
            check_all(eng)
        assert not eng.has_unfinished(), "engine did not drain"
        c = eng.stats.counters       # steer generation toward the interesting paths
        for label in ("preemptions", "evictions", "cow_copies", "dedup_joined", "prefix_hits",
                      "kv_reload_blocks", "swap_ins"):
            target(float(getattr(c, label)), label=label)
        self._check_outputs()
        for rid, (req, want, reason) in self.reqs.items():
            assert req.finish_reason in ("length", "stop", "cancelled"), (rid, req.finish_reason)
        eng.pool.check([])
        eng.clear_prefix_cache()
        assert eng.pool.num_free == eng.pool.num_blocks and (eng.pool.refcounts == 0).all()
        if eng.host is not None:
            eng.host.check([])
            assert eng.host.pool.num_free == eng.host.num_blocks


def test_engine_state_machine(pytestconfig):
    """CI runs a fixed example set (derandomized: a landing never depends on luck): 30
    examples in the fast tier, 100 with --run-slow; ROSEPLAY_PROPERTY_RANDOM=1 explores
    new ones (that is how the prefill-first livelock of tests/engine/core/test_policies.py
    was found)."""
    run_state_machine_as_test(EngineMachine, settings=settings(
        max_examples=100 if run_slow(pytestconfig) else 30, stateful_step_count=80,
        deadline=None, database=None,
        derandomize=not os.environ.get("ROSEPLAY_PROPERTY_RANDOM"),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                               HealthCheck.data_too_large]))


# -- focused properties (plain hypothesis) ---------------------------------------------------

@given(prompts=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=30),
                        min_size=1, max_size=12),
       num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 16]),
       budget=st.sampled_from([1, 4, 16, 256]), seqs=st.sampled_from([1, 3, 16]),
       caching=st.booleans(), max_tokens=st.integers(1, 6))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_outputs_do_not_depend_on_knobs_or_pool(prompts, num_blocks, block_size, budget, seqs,
                                                caching, max_tokens):
    """Small alphabet (0..40): many shared prefixes and identical prompts."""
    eng = make_engine(max(num_blocks, -(-(30 + max_tokens) // block_size)), block_size,
                      enable_prefix_caching=caching, max_num_batched_tokens=budget,
                      max_num_seqs=seqs)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    reqs = [add_request(eng, {"prompt_token_ids": p}, params) for p in prompts]
    for _ in range(5000):
        if not eng.has_unfinished():
            break
        eng.step()
        check_all(eng)
    assert not eng.has_unfinished()
    for p, r in zip(prompts, reqs):
        assert (r.output_token_ids, r.finish_reason) == expected(p, params, eng.eos_token_ids)
    eng.clear_prefix_cache()
    assert eng.pool.num_free == eng.pool.num_blocks

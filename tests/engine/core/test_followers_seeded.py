"""Seeded dedup followers sent back to the queue while a step held their first sample
(their leader cancelled while its prompt step was in flight; a failed token read): they
draw their first tokens afresh, as alone, so their tokens are their solo run's (the
lost draws had advanced their seeded generators). The fake model ranks every token
(test_exactness_sampled.DenseRunner)."""
from __future__ import annotations

import pytest

from engine.request import SamplingParams
from tests.engine.core.test_exactness_sampled import Solo, Stream, dense_engine
from tests.helpers import add_request


@pytest.fixture(scope="module")
def solo():
    s = Solo()
    yield s
    s.eng.close()


def test_a_seeded_follower_sent_back_by_its_leaders_cancel_keeps_its_tokens(solo):
    """The leader's prompt step is in flight (async scheduling) with a seeded dedup
    follower's row when the leader is cancelled: the follower goes back to the queue and
    samples its first token afresh, from a generator that row's draw did not advance."""
    prompt = list(range(10, 30))
    lead = SamplingParams(max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)
    follow = lead.replace(seed=6)
    want = solo.run(prompt, follow).tokens
    eng = dense_engine(32, 4, max_num_batched_tokens=512, async_scheduling=True)
    try:
        add_request(eng, {"prompt_token_ids": prompt}, lead, request_id="lead")
        add_request(eng, {"prompt_token_ids": prompt}, follow, request_id="follow")
        s = Stream()
        s.take(eng.step(), "follow")           # launched, left in flight
        assert eng.requests["follow"].dedup_leader is eng.requests["lead"]
        s.take(eng.abort_output("lead"), "follow")
        while eng.has_unfinished():
            s.take(eng.step(), "follow")
        assert (s.tokens, s.reason) == (want, "length")
        assert not eng.executor.runner.sampler.generators
    finally:
        eng.close()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_seeded_followers_recomputed_after_a_failed_token_read_keep_their_tokens(
        solo, async_scheduling):
    """Reading a step's tokens fails (budget 1): its plans' requests end with the error,
    and the dedup followers whose first tokens it held are recomputed (async_steps.py;
    synchronous: StepFaults._fail_plan); they draw those tokens afresh, as alone (the
    failed step's draws had advanced their seeded generators)."""
    prompt = list(range(10, 14))
    lead = SamplingParams(max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)
    follow = [lead.replace(seed=6 + i) for i in range(3)]
    want = [solo.run(prompt, p).tokens for p in follow]
    eng = dense_engine(32, 4, max_num_batched_tokens=1, async_scheduling=async_scheduling)
    try:
        for rid, p in [("lead", lead)] + [(f"f{i}", p) for i, p in enumerate(follow)]:
            add_request(eng, {"prompt_token_ids": prompt}, p, request_id=rid)
        real, calls = eng._emit_tokens, []

        def emit(launched, out):
            calls.append(1)
            if len(calls) == 4:        # the step that samples the prompt's last token
                raise RuntimeError("device lost")
            return real(launched, out)
        eng._emit_tokens = emit
        streams = [Stream() for _ in follow]
        while eng.has_unfinished():
            out = eng.step()
            for i, s in enumerate(streams):
                s.take(out, f"f{i}")
        assert [(s.tokens, s.reason) for s in streams] == [(w, "length") for w in want]
    finally:
        eng.close()

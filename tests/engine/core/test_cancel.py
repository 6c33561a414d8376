"""Cancellation at every stage (waiting, mid-chunked-prefill, decoding, preempted,
dedup follower and leader): blocks are freed, streams end with "cancelled", and the
other requests finish with the tokens of a clean reference run. Driven one step at a
time through LLMEngine.step() and through a paused EngineLoop."""
from __future__ import annotations

import pytest

from tests.engine.fault_harness import (TIMEOUT, assert_all_free, check_cancelled, prompt,
    reference, run_until, sp)

# -- cancellation at every stage ----------------------------------------------------------

def test_cancel_waiting(ckpt, make):
    h = make(max_num_seqs=1)
    a, b = prompt(1, 10), prompt(2, 10)
    h.submit(a, sp(), "a")
    h.submit(b, sp(), "b")
    h.step()
    assert h.req("b").status.value == "waiting" and not h.req("b").block_table
    h.cancel("b")
    assert check_cancelled(h, "b") == []
    assert h.finish("a") == ("length", reference(ckpt, a, 8), None)
    h.loop.wait_idle(TIMEOUT) if hasattr(h, "loop") else None
    assert_all_free(h.engine)


def test_cancel_mid_chunked_prefill(ckpt, make):
    h = make(max_num_batched_tokens=8)
    other, long = prompt(3, 6), prompt(4, 60)
    h.submit(other, sp(12), "other")
    h.step()
    h.submit(long, sp(), "long")
    run_until(h, lambda: h.req("long").num_computed_tokens >= 20)
    r = h.req("long")
    assert r.is_prefilling and len(r.block_table) >= 5 and not r.output_token_ids
    used = h.engine.pool.num_used
    h.cancel("long")
    assert check_cancelled(h, "long") == []
    assert h.engine.pool.num_used < used
    h.engine.check_invariants()
    assert h.finish("other") == ("length", reference(ckpt, other, 12), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


def test_cancel_decoding(ckpt, make):
    h = make()
    a, b = prompt(5, 13), prompt(6, 9)
    h.submit(a, sp(10), "a")
    h.submit(b, sp(10), "b")
    run_until(h, lambda: len(h.req("a").output_token_ids) >= 3)
    h.cancel("a")
    got = check_cancelled(h, "a", min_tokens=3)
    assert got == reference(ckpt, a, 10)[:len(got)]     # the tokens it had were right
    assert h.finish("b") == ("length", reference(ckpt, b, 10), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


def test_cancel_preempted(ckpt, make):
    # 6 blocks of 4: two 8-token prompts decoding 12 tokens each cannot both stay
    h = make(num_blocks=6)
    a, b = prompt(7, 8), prompt(8, 8)
    h.submit(a, sp(12), "a")
    h.submit(b, sp(12), "b")
    run_until(h, lambda: h.req("b").num_preemptions > 0)
    rb = h.req("b")
    assert rb.status.value == "waiting" and not rb.block_table and rb.output_token_ids
    h.cancel("b")
    got = check_cancelled(h, "b", min_tokens=1)
    assert got == reference(ckpt, b, 12)[:len(got)]
    assert h.finish("a") == ("length", reference(ckpt, a, 12), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert h.engine.stats.counters.preemptions >= 1
    assert_all_free(h.engine)


def test_cancel_dedup_follower(ckpt, make):
    h = make(max_num_batched_tokens=8)
    p = prompt(9, 30)
    for rid in ("lead", "f1", "f2"):
        h.submit(p, sp(), rid)
    h.step()
    lead, f1 = h.req("lead"), h.req("f1")
    assert f1.dedup_leader is lead and h.req("f2").dedup_leader is lead
    assert lead.is_prefilling
    h.cancel("f1")
    assert check_cancelled(h, "f1") == []
    ref = reference(ckpt, p, 8)
    assert h.finish("lead") == ("length", ref, None)
    assert h.finish("f2") == ("length", ref, None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert h.engine.stats.counters.prefill_tokens == 30      # f2 never prefilled again
    assert_all_free(h.engine)


@pytest.mark.parametrize("after_steps", [1, 2])
def test_cancel_dedup_leader_followers_continue(ckpt, make, after_steps):
    h = make(max_num_batched_tokens=8)
    p = prompt(10, 30)
    for rid in ("lead", "f1", "f2"):
        h.submit(p, sp(), rid)
    for _ in range(after_steps):
        h.step()
    assert h.req("f1").dedup_leader is h.req("lead")
    h.cancel("lead")
    assert check_cancelled(h, "lead") == []
    ref = reference(ckpt, p, 8)
    assert h.finish("f1") == ("length", ref, None)
    assert h.finish("f2") == ("length", ref, None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    c = h.engine.stats.counters
    assert c.cancelled == 1 and c.finished == 2
    assert_all_free(h.engine)


def test_cancel_everything_at_once_and_unknown_ids(ckpt, make):
    h = make(num_blocks=16, max_num_batched_tokens=8, max_num_seqs=3)
    prompts = {f"r{i}": prompt(20 + i, 5 + 7 * i) for i in range(6)}
    prompts["dup"] = prompts["r1"]
    for rid, p in prompts.items():
        h.submit(p, sp(12), rid)
    for _ in range(5):
        h.step()
    for rid in prompts:
        h.cancel(rid)
    for rid in prompts:
        reason, tokens, _ = h.finish(rid)
        assert reason == "cancelled"
        assert tokens == reference(ckpt, prompts[rid], 12)[:len(tokens)]
    if hasattr(h, "loop"):
        h.loop.cancel("no-such-id")          # cancelling unknown / finished ids is a no-op
        h.loop.cancel("r0")
        assert h.loop.wait_idle(TIMEOUT)
    else:
        assert h.engine.abort("no-such-id") is None and h.engine.abort("r0") is None
    assert_all_free(h.engine)

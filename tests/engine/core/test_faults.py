"""Faults: failing steps (cancellation: test_cancel.py; loop-level faults: test_loop_faults.py).

Stages are driven deterministically, one engine step at a time: directly with
LLMEngine.step(), and through a paused EngineLoop with step_once(). After each fault
the pool invariants hold, the other requests finish with the tokens of a clean
reference run, and once everything is done and the prefix cache is cleared every block
is free.
"""
from __future__ import annotations


import pytest

from engine import EngineLoop

from tests.engine.fault_harness import (TIMEOUT, assert_all_free, engine_kw, fail_once, prompt,
    reference, run_until, sp)

# -- failing steps --------------------------------------------------------------------------

def test_transient_forward_failure_fails_nobody_and_is_reported(ckpt, make, monkeypatch):
    """A step of two requests fails once: each request's part is run alone, succeeds,
    and both go on with the reference tokens; the fault shows in the snapshot."""
    h = make(max_num_seqs=2)
    prompts = {f"r{i}": prompt(30 + i, 6 + 3 * i) for i in range(4)}
    for rid, p in prompts.items():
        h.submit(p, sp(6), rid)
    h.step()
    state = fail_once(monkeypatch, h.engine.executor.runner, "execute", RuntimeError("boom: CUDA-ish failure"))
    h.step()                     # r0, r1 decode in this step; r2, r3 wait
    assert state["fired"] == 1
    for rid in prompts:
        assert h.finish(rid) == ("length", reference(ckpt, prompts[rid], 6), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
        assert h.loop.snapshot().error.startswith("RuntimeError: boom")
    assert h.engine.stats.counters.errors == 0
    assert_all_free(h.engine)


def test_forward_failure_of_a_lone_request_fails_it_and_engine_recovers(ckpt, make, monkeypatch):
    h = make(max_num_seqs=1)
    prompts = {f"r{i}": prompt(30 + i, 6 + 3 * i) for i in range(2)}
    for rid, p in prompts.items():
        h.submit(p, sp(6), rid)
    h.step()
    fail_once(monkeypatch, h.engine.executor.runner, "execute", RuntimeError("boom: CUDA-ish failure"))
    h.step()                     # r0 alone decodes: it fails; r1 waits
    reason, tokens, error = h.finish("r0")
    assert reason == "error" and "RuntimeError: boom: CUDA-ish failure" in error
    assert tokens == reference(ckpt, prompts["r0"], 6)[:len(tokens)]
    assert h.finish("r1") == ("length", reference(ckpt, prompts["r1"], 6), None)
    h.submit(prompts["r0"], sp(6), "again")      # the same prompt is served after the fault
    assert h.finish("again") == ("length", reference(ckpt, prompts["r0"], 6), None)
    assert h.engine.stats.counters.errors == 1
    assert_all_free(h.engine)


def test_forward_fails_on_a_condition(ckpt, make, monkeypatch):
    """A 'poison' token crashes the forward whenever it is in the batch: the step is
    rerun request by request, so only the request that carries it errors (or one whose
    own output came to contain it); its batch-mates finish with the reference tokens."""
    POISON = 13
    h = make(max_num_seqs=3, max_num_batched_tokens=16)
    model = h.engine.executor.runner.model
    real = model.forward

    def forward(input_ids, *args, **kwargs):
        if (input_ids == POISON).any():
            raise ValueError("poisoned token in batch")
        return real(input_ids, *args, **kwargs)
    monkeypatch.setattr(model, "forward", forward)
    prompts = {f"r{i}": [t for t in prompt(40 + i, 9) if t != POISON] for i in range(6)}
    prompts["bad"] = [1, 2, POISON, 4]
    for rid, p in prompts.items():
        h.submit(p, sp(5), rid)
    results = {rid: h.finish(rid) for rid in prompts}
    assert results["bad"][0] == "error" and "poisoned token" in results["bad"][2]
    ok = 0
    for rid, (reason, tokens, error) in results.items():
        if rid == "bad":
            continue
        ref = reference(ckpt, prompts[rid], 5)
        if POISON in ref[:-1]:
            assert reason == "error" and tokens == ref[:len(tokens)]
        else:
            assert (reason, tokens, error) == ("length", ref, None)
            ok += 1
    assert ok >= 5
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


@pytest.mark.parametrize("fail_at", [3, 8])
def test_failure_in_steady_decode_of_running_loop(ckpt, monkeypatch, fail_at):
    """A forward failing while the loop runs unpaused (async scheduling: the failing
    launch is planned while the step before it is still in flight). The step before
    still delivers its tokens; the failed step is rerun request by request once those
    are read, so a fault that does not come back fails nobody (one that does fails its
    request); none hangs, every token equals the reference, the error is reported, and
    the engine serves the next ones with the reference tokens."""
    prompts = [prompt(120 + i, 5 + i) for i in range(4)]
    with EngineLoop(model=ckpt, **engine_kw(max_num_seqs=4)) as loop:
        runner = loop.engine.executor.runner
        real, calls = runner.execute, {"n": 0}

        def execute(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise RuntimeError("device fault")
            return real(*args, **kwargs)
        monkeypatch.setattr(runner, "execute", execute)
        streams = [loop.submit({"prompt_token_ids": p}, sp(30)) for p in prompts]
        outs = [s.result(timeout=TIMEOUT) for s in streams]
        errored = 0
        for p, o in zip(prompts, outs):
            ref, got = reference(ckpt, p, 30), list(o.outputs[0].token_ids)
            if o.outputs[0].finish_reason == "error":
                errored += 1
                assert o.error == "RuntimeError: device fault" and got == ref[:len(got)]
            else:
                assert got == ref
        assert calls["n"] > fail_at and loop.engine.stats.last_error == "RuntimeError: device fault"
        again = [loop.submit({"prompt_token_ids": p}, sp(10)) for p in prompts]
        for p, s in zip(prompts, again):
            assert list(s.result(timeout=TIMEOUT).outputs[0].token_ids) == reference(ckpt, p, 10)
        assert loop.wait_idle(TIMEOUT) and loop.fatal_error is None
        assert_all_free(loop.engine)


def test_sampler_failure(ckpt, make, monkeypatch):
    h = make()
    a = prompt(50, 11)
    h.submit(a, sp(), "a")
    h.step()
    sampler = h.engine.executor.runner.sampler
    name = "sample_async" if hasattr(sampler, "sample_async") else "sample"
    fail_once(monkeypatch, sampler, name, FloatingPointError("nan logits"))
    h.step()
    reason, tokens, error = h.finish("a")
    assert reason == "error" and error == "FloatingPointError: nan logits" and len(tokens) == 1
    h.submit(a, sp(), "b")
    assert h.finish("b") == ("length", reference(ckpt, a, 8), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


def test_forward_failure_during_dedup_prefill(ckpt, make, monkeypatch):
    h = make(max_num_batched_tokens=8)
    p = prompt(60, 30)
    for rid in ("lead", "f1", "f2"):
        h.submit(p, sp(), rid)
    h.step()
    fail_once(monkeypatch, h.engine.executor.runner, "execute", RuntimeError("oom"))
    h.step()
    assert h.finish("lead") == ("error", [], "RuntimeError: oom")
    for rid in ("f1", "f2"):       # followers of a failed leader are re-planned, not failed
        assert h.finish(rid) == ("length", reference(ckpt, p, 8), None)
    h.submit(p, sp(), "again")     # cached blocks of the failed leader are still valid
    assert h.finish("again") == ("length", reference(ckpt, p, 8), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


def test_failure_after_leader_sampled_does_not_strand_followers(ckpt, make, monkeypatch):
    """An exception in the update after the forward (here: in the per-token
    bookkeeping of the leader's token, after the follower took the leader's blocks but
    before it got its token) must not leave a follower with all its KV computed and no
    token: such a request can never be scheduled again and would hang its stream."""
    h = make(max_num_batched_tokens=64)
    p = prompt(70, 10)
    h.submit(p, sp(), "lead")
    h.submit(p, sp(), "f1")
    eng = h.engine
    fired = []

    class FailingStopIds(frozenset):
        """The leader's stop-token check (per-token bookkeeping) raises once."""
        def __contains__(self, token):
            if not fired:
                fired.append(1)
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")
            return frozenset.__contains__(self, token)

    lead = eng.requests["lead"]     # both harnesses hold it (paused) once submitted
    lead.stop_ids = FailingStopIds(lead.stop_ids)
    run_until(h, lambda: fired)
    reason, tokens, error = h.finish("lead")
    assert reason == "error" and "UnicodeDecodeError" in error
    reason, tokens, error = h.finish("f1")      # must end: error, or the right tokens
    assert (reason == "error" and "UnicodeDecodeError" in error) or \
        (reason, tokens) == ("length", reference(ckpt, p, 8))
    h.submit(p, sp(), "again")
    assert h.finish("again") == ("length", reference(ckpt, p, 8), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert_all_free(h.engine)


def test_repeated_failures_then_recovery(ckpt, make, monkeypatch):
    h = make(max_num_seqs=4)
    runner = h.engine.executor.runner
    real = runner.execute
    broken = {"on": True}
    monkeypatch.setattr(runner, "execute",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost"))
                        if broken["on"] else real(*a, **k))
    prompts = {f"r{i}": prompt(80 + i, 4 + i) for i in range(8)}
    for rid, p in prompts.items():
        h.submit(p, sp(4), rid)
    for rid in prompts:
        assert h.finish(rid)[0] == "error"
    broken["on"] = False
    for rid, p in prompts.items():
        h.submit(p, sp(4), rid + "-again")
    for rid, p in prompts.items():
        assert h.finish(rid + "-again") == ("length", reference(ckpt, p, 4), None)
    if hasattr(h, "loop"):
        h.loop.wait_idle(TIMEOUT)
    assert h.engine.stats.counters.errors == 8
    assert_all_free(h.engine)

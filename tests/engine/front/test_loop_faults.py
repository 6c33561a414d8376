"""Loop faults: fatal errors (the loop stops cleanly), close(), racing clients, dropped
streams. Shared harness and invariants: tests/engine/fault_harness.py."""
from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from engine import LLM, EngineLoop

from tests.engine.fault_harness import (BS, TIMEOUT, assert_all_free, engine_kw, fail_once,
    prompt, reference, sp)

# -- fatal errors in the loop -------------------------------------------------------------------

def test_scheduler_exception_stops_loop_cleanly(ckpt):
    loop = EngineLoop(model=ckpt, **engine_kw())
    try:
        loop.pause()
        streams = [loop.submit({"prompt_token_ids": prompt(90 + i, 6)}, sp(20)) for i in range(3)]
        assert loop.step_once().wait(TIMEOUT)
        real = loop.engine.scheduler.schedule

        def schedule():
            raise KeyError("scheduler state corrupted")
        loop.engine.scheduler.schedule = schedule
        late = loop.submit({"prompt_token_ids": [1, 2, 3]}, sp(2))
        done = loop.step_once()
        for s in streams + [late]:
            out = s.result(timeout=TIMEOUT)
            assert out.finished and out.outputs[0].finish_reason == "error"
            assert "scheduler state corrupted" in out.error
        assert "KeyError" in loop.fatal_error and "scheduler state corrupted" in loop.fatal_error
        assert done.wait(TIMEOUT)                    # a pending single step is released
        assert not loop.wait_idle(TIMEOUT)           # died: never "idle" (engine/front/api.py)
        assert "scheduler state corrupted" in loop.snapshot().error
        with pytest.raises(RuntimeError, match="engine is stopped.*scheduler state corrupted"):
            loop.submit({"prompt_token_ids": [1, 2]}, sp(2))
        loop.engine.scheduler.schedule = real
        assert loop.engine.requests == {}
        loop.engine.check_invariants()
    finally:
        loop.close()
    assert not loop.transport.thread.is_alive()


def test_exception_in_snapshot_stops_loop_cleanly(ckpt, monkeypatch):
    loop = EngineLoop(model=ckpt, **engine_kw())
    try:
        s = loop.submit({"prompt_token_ids": [5, 6, 7]}, sp(200))
        assert s.get(timeout=TIMEOUT).token_ids          # running
        calls = {"n": 0}
        real = loop.engine.snapshot

        def snapshot(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise MemoryError("snapshot")
            return real(*a, **k)
        monkeypatch.setattr(loop.engine, "snapshot", snapshot)
        loop.core._next_publish = 0.0
        out = s.result(timeout=TIMEOUT)
        assert out.outputs[0].finish_reason == "error" and "MemoryError" in out.error
        assert loop.fatal_error and "MemoryError" in loop.fatal_error
    finally:
        loop.close()


def test_close_ends_every_stream(ckpt):
    loop = EngineLoop(model=ckpt, **engine_kw(num_blocks=16, max_num_seqs=2))
    loop.pause()
    streams = [loop.submit({"prompt_token_ids": prompt(100 + i, 8)}, sp(50)) for i in range(4)]
    assert loop.step_once().wait(TIMEOUT)
    pending = loop.step_once()
    loop.close()
    for s in streams:
        out = s.result(timeout=TIMEOUT)         # nobody waits forever on a closed loop
        assert out.finished and out.outputs[0].finish_reason in ("cancelled", "length")
    assert pending.wait(TIMEOUT)
    with pytest.raises(RuntimeError, match="stopped"):
        loop.submit({"prompt_token_ids": [1]}, sp(1))
    assert loop.step_once().wait(1)          # nothing will run it: it must not block
    loop.cancel("anything")                  # harmless no-ops after close
    loop.set_knobs(max_num_seqs=3)
    assert not loop.engine.requests
    assert_all_free(loop.engine)


def test_submit_racing_close_never_hangs(ckpt):
    loop = EngineLoop(model=ckpt, **engine_kw())
    streams, errors = [], []

    def submitter():
        for i in range(200):
            try:
                streams.append(loop.submit({"prompt_token_ids": [1 + i % 50, 2]}, sp(3)))
            except RuntimeError:
                errors.append(i)

    t = threading.Thread(target=submitter)
    t.start()
    time.sleep(0.01)
    loop.close()
    t.join(TIMEOUT)
    for s in streams:
        assert s.result(timeout=TIMEOUT).finished
    assert len(streams) + len(errors) == 200


def test_many_client_threads(ckpt):
    """Four client threads submit, cancel and flip knobs at once: every stream ends,
    finished outputs equal the reference, cancelled ones are a prefix of it."""
    import random
    prompts = [prompt(300 + i, 3 + i % 20) for i in range(96)]
    results, failures = {}, []
    with EngineLoop(model=ckpt, **engine_kw(num_blocks=20, max_num_seqs=8)) as loop:
        def client(k):
            try:
                rng, mine = random.Random(k), {}
                for j in range(k, len(prompts), 4):
                    mine[j] = loop.submit({"prompt_token_ids": prompts[j]}, sp(6),
                                          request_id=f"c{j}")
                    if rng.random() < 0.2:
                        loop.cancel(f"c{rng.choice(list(mine))}")
                    if rng.random() < 0.3:
                        loop.set_knobs(max_num_batched_tokens=rng.choice([1, 8, 64]))
                    if rng.random() < 0.15:
                        loop.set_knobs(enable_prefix_caching=rng.random() < 0.5,
                                       max_num_seqs=rng.choice([1, 4, 8]))
                    if rng.random() < 0.05:
                        loop.reset_prefix_cache()
                for j, s in mine.items():
                    o = s.result(timeout=TIMEOUT)
                    results[j] = (o.outputs[0].finish_reason, list(o.outputs[0].token_ids))
            except Exception as exc:   # pragma: no cover - reported below
                failures.append(repr(exc))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(4 * TIMEOUT)
        assert not failures and len(results) == len(prompts)
        for j, (reason, tokens) in results.items():
            ref = reference(ckpt, prompts[j], 6)
            assert reason in ("length", "cancelled")
            assert tokens == (ref if reason == "length" else ref[:len(tokens)])
        assert loop.wait_idle(TIMEOUT) and loop.fatal_error is None
        assert_all_free(loop.engine)


# -- streams whose consumer went away ---------------------------------------------------------

def test_dropped_stream_cancels_request_and_frees_blocks(ckpt):
    with EngineLoop(model=ckpt, **engine_kw()) as loop:
        loop.pause()
        keep = loop.submit({"prompt_token_ids": prompt(110, 9)}, sp(10))
        drop = loop.submit({"prompt_token_ids": prompt(111, 21)}, sp(40), request_id="gone")
        for _ in range(3):
            assert loop.step_once().wait(TIMEOUT)
        assert loop.engine.requests["gone"].block_table
        del drop
        gc.collect()
        loop.resume()
        out = keep.result(timeout=TIMEOUT)
        assert list(out.outputs[0].token_ids) == reference(ckpt, prompt(110, 9), 10)
        assert loop.wait_idle(TIMEOUT)
        gone = [v for v in loop.snapshot().requests if v.request_id == "gone"]
        assert loop.engine.stats.counters.cancelled == 1
        assert gone and gone[0].state == "cancelled"
        assert_all_free(loop.engine)


@pytest.mark.slow
def test_dropped_streams_under_load(ckpt):
    """Many consumers drop their streams mid-flight; the rest are served correctly."""
    with EngineLoop(model=ckpt, **engine_kw(num_blocks=24, max_num_seqs=8)) as loop:
        kept = {}
        for i in range(40):
            p = prompt(200 + i, 3 + i % 17)
            s = loop.submit({"prompt_token_ids": p}, sp(8))
            if i % 3:
                kept[i] = (p, s)
            del s
            if i % 5 == 0:
                gc.collect()
        gc.collect()
        for i, (p, s) in kept.items():
            out = s.result(timeout=TIMEOUT)
            assert list(out.outputs[0].token_ids) == reference(ckpt, p, 8)
        assert loop.wait_idle(TIMEOUT)
        c = loop.engine.stats.counters
        assert c.finished + c.cancelled == 40 and c.finished >= len(kept)
        assert_all_free(loop.engine)


def test_stream_iteration_ends_on_error(ckpt, monkeypatch):
    with EngineLoop(model=ckpt, **engine_kw()) as loop:
        loop.pause()
        s = loop.submit({"prompt_token_ids": [3, 4, 5]}, sp(8))
        assert loop.step_once().wait(TIMEOUT)
        fail_once(monkeypatch, loop.engine.executor.runner, "execute", RuntimeError("x"))
        loop.resume()
        events = []
        deadline = time.monotonic() + TIMEOUT
        for ev in s:                  # must terminate
            events.append(ev)
            assert time.monotonic() < deadline
        assert events[-1].finished and events[-1].finish_reason == "error"
        assert s.output.error == "RuntimeError: x"
        # nothing new after the final event: a late reader gets the final one again (so a
        # second thread reading the same stream can never block forever)
        assert s.get(timeout=0.05) is events[-1]


# -- engines built and dropped in one process (GPU) -------------------------------------------

@pytest.mark.gpu
def test_new_engine_while_a_dropped_one_awaits_collection(ckpt, monkeypatch):
    """A dropped engine held only by reference cycles is freed by some automatic gc run.
    If that run falls inside the next engine's CUDA graph capture, destroying the old
    graphs invalidates the capture and torch's CUDA RNG stays broken for the process
    ('Offset increment outside graph capture'). Here the automatic run is made to come
    during capture (whenever gc is enabled then): each new engine must still capture
    and serve."""
    import gc
    from engine.worker.cuda_graphs import StepGraphs
    real = StepGraphs._forward

    def forward(self, kind, size):
        if torch.cuda.is_current_stream_capturing() and gc.isenabled():
            gc.collect()                    # what an automatic collection would do here
        return real(self, kind, size)
    monkeypatch.setattr(StepGraphs, "_forward", forward)
    kw = dict(device="cuda", dtype="float32", block_size=BS, num_blocks=64)
    p, params = prompt(400, 7), sp(5)
    want = None
    threshold = gc.get_threshold()
    gc.set_threshold(10**9)                 # no automatic run before the capture
    try:
        for _ in range(3):
            llm = LLM(model=ckpt, **kw)
            llm.engine.cycle = llm          # only the cyclic collector can free it
            got = llm.generate([{"prompt_token_ids": p}], params)[0].outputs[0].token_ids
            assert want is None or got == want
            want = got
            del llm
    finally:
        gc.set_threshold(*threshold)

"""Soak: thousands of requests through EngineLoop under churn, checked token by token.

A tiny Llama checkpoint on the CPU, a KV pool far too small for the load (evictions
and preemptions), live knob flips every few steps (prefix cache, token budget,
max_num_seqs), prefix-cache clears, pause / single-step / resume, random cancels and
dropped streams. Checks: every request ends (finished or cancelled, never an error,
never a hang), finished greedy outputs equal a reference LLM.generate run with fixed
knobs, cancelled ones are a prefix of it, the pool invariants hold after every step
(check_invariants=True), and no block leaks.

The CI version runs 2,000 requests; `pytest --run-slow` (or ROSEPLAY_SLOW=1) adds a
20,000-request run. Numbers for docs/RELIABILITY.md: `ROSEPLAY_SOAK_REPORT=1 pytest
tests/engine/core/test_soak.py -s` prints them.
"""
from __future__ import annotations

import gc
import os
import random
import time
from collections import deque

import pytest

from engine import LLM, EngineLoop, SamplingParams
from tests.hf_models import make_checkpoint

pytestmark = pytest.mark.slow       # the long tier: `pytest --run-slow` (README)

VOCAB = 320
TIMEOUT = 60
DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")   # "cuda": same soak on a GPU
POOL = dict(block_size=4, num_blocks=24)        # 96 tokens for up to 32 running requests
REFERENCE_KNOBS = dict(block_size=16, num_blocks=512, max_num_seqs=64,
                       max_num_batched_tokens=512, enable_prefix_caching=True)


def workload(n: int, seed: int):
    """Short prompts: shared system prefixes, identical repeats, random ones."""
    rng = random.Random(seed)
    systems = [[rng.randrange(VOCAB) for _ in range(rng.choice([4, 6, 8, 12]))] for _ in range(8)]
    prompts, params = [], []
    for _ in range(n):
        x = rng.random()
        if x < 0.15 and prompts:
            p = list(rng.choice(prompts[-40:]))                  # identical: dedup / full hit
        elif x < 0.6:
            p = rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))]
        else:
            p = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        prompts.append(p)
        params.append(SamplingParams(max_tokens=rng.randint(1, 8), temperature=0,
                                     ignore_eos=rng.random() < 0.8))
    return prompts, params


def reference(ckpt, prompts, params):
    llm = LLM(model=ckpt, device=DEVICE, dtype="float32", **REFERENCE_KNOBS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]


def drain(stream) -> bool:
    """Pull whatever events are there without blocking; True once it has ended."""
    while stream.output is None:
        try:
            stream.get(timeout=0)
        except Exception:
            return False
    return True


def soak(ckpt, n: int, seed: int, max_in_flight: int = 48):
    prompts, params = workload(n, seed)
    t0 = time.perf_counter()
    ref = reference(ckpt, prompts, params)
    t_ref = time.perf_counter() - t0
    rng = random.Random(seed + 1)
    results: dict[int, tuple] = {}
    dropped: set[int] = set()
    stats = dict(knob_flips=0, cache_clears=0, cancel_calls=0, single_steps=0)
    t0 = time.perf_counter()
    loop = EngineLoop(model=ckpt, device=DEVICE, dtype="float32", check_invariants=True,
                      max_num_seqs=16, max_num_batched_tokens=32, **POOL)
    eng = loop.engine
    try:
        pending, live = deque(range(n)), {}
        deadline = time.monotonic() + 20 * 60
        while pending or live:
            assert time.monotonic() < deadline, "soak made no progress"
            assert loop.fatal_error is None, loop.fatal_error
            while pending and len(live) < max_in_flight and rng.random() < 0.9:
                i = pending.popleft()
                live[i] = loop.submit({"prompt_token_ids": prompts[i]}, params[i],
                                      request_id=f"s{i}")
            x = rng.random()
            if x < 0.35:                                    # knob flip
                knob = rng.choice(["enable_prefix_caching", "max_num_batched_tokens",
                                   "max_num_seqs"])
                value = {"enable_prefix_caching": rng.random() < 0.6,
                         "max_num_batched_tokens": rng.choice([1, 4, 8, 16, 32, 64, 128]),
                         "max_num_seqs": rng.choice([1, 2, 4, 8, 16, 32])}[knob]
                loop.set_knobs(**{knob: value})
                stats["knob_flips"] += 1
            elif x < 0.38:
                loop.reset_prefix_cache()
                stats["cache_clears"] += 1
            elif x < 0.40:                                  # pause, single steps, resume
                for _ in range(rng.randint(1, 3)):
                    assert loop.step_once().wait(TIMEOUT)
                    stats["single_steps"] += 1
                loop.resume()
            for i in rng.sample(sorted(live), k=min(len(live), rng.choice([0, 0, 0, 0, 0, 1, 2]))):
                loop.cancel(f"s{i}")                        # at whatever stage it is
                stats["cancel_calls"] += 1
            if live and rng.random() < 0.01:                # the consumer goes away
                i = rng.choice(sorted(live))
                del live[i]
                dropped.add(i)
                gc.collect()
            steps = eng.stats.counters.steps                # let a few steps run
            target = steps + rng.randint(1, 4)
            wait_until = time.monotonic() + 5
            while (eng.stats.counters.steps < target and eng.has_unfinished()
                   and time.monotonic() < wait_until):
                time.sleep(0.0005)
            for i in [i for i, s in live.items() if drain(s)]:
                o = live.pop(i).output
                results[i] = (list(o.outputs[0].token_ids), o.outputs[0].finish_reason, o.error)
        for i, s in live.items():
            o = s.result(timeout=TIMEOUT)
            results[i] = (list(o.outputs[0].token_ids), o.outputs[0].finish_reason, o.error)
        assert loop.wait_idle(TIMEOUT)
        wall = time.perf_counter() - t0
        c = eng.stats.counters
        # every request ended: finished with the reference tokens, or cancelled on a prefix
        finished = cancelled = 0
        for i, (tokens, reason, error) in results.items():
            ref_tokens, ref_reason = ref[i]
            if reason == "cancelled":
                cancelled += 1
                assert tokens == ref_tokens[:len(tokens)], (i, tokens, ref_tokens)
            else:
                finished += 1
                assert (tokens, reason, error) == (ref_tokens, ref_reason, None), \
                    (i, prompts[i], params[i], tokens, ref_tokens)
        assert len(results) + len(dropped) == n
        assert c.errors == 0
        assert c.finished + c.cancelled == n
        assert c.preemptions > 0 and c.evictions > 0 and c.cancelled > 0
        assert c.dedup_joined > 0 and c.prefix_hits > 0
        # zero leaks
        eng.check_invariants()
        loop.reset_prefix_cache()
        assert loop.wait_idle(TIMEOUT)
        eng.pool.check([])
        assert eng.pool.num_free == eng.pool.num_blocks and (eng.pool.refcounts == 0).all()
        report = dict(requests=n, finished=finished, cancelled=cancelled,
                      dropped_streams=len(dropped), wall_s=round(wall, 1),
                      reference_s=round(t_ref, 1), steps=c.steps,
                      preemptions=c.preemptions, evictions=c.evictions,
                      prefix_hits=c.prefix_hits, dedup_joined=c.dedup_joined,
                      cow_copies=c.cow_copies, generated_tokens=c.generated_tokens,
                      peak_used_blocks=eng.stats.peak_used_blocks, **stats)
        if os.environ.get("ROSEPLAY_SOAK_REPORT"):
            print("\nSOAK", report)
        return report
    finally:
        loop.close()


def test_soak_2000(ckpt):
    soak(ckpt, 2000, seed=1)


@pytest.mark.slow
def test_soak_20000(ckpt):
    soak(ckpt, 20000, seed=2)

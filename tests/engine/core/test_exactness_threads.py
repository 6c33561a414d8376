"""Exactness through the front under concurrent clients: threads share one EngineLoop
(the core on its own thread, async scheduling, a host tier, a small pool) and each
submits seeded, penalised, biased, constrained and logprob requests
(test_exactness_sampled.draw_params), cancels some, drops some streams, and flips knobs,
clears the cache or pauses, single-steps and resumes the engine meanwhile (one thread's
resume may land before another's single step). Every request that
finishes has its solo run's tokens and logprobs, a cancelled one a prefix of them; after
it all nothing is left: no request, block, host block, grammar or sampler state."""
from __future__ import annotations

import gc
import os
import random
import threading

import pytest

from engine.commands import ResetPrefixCache
from engine.config import InvalidRequestError
from engine.front.loop import EngineLoop
from tests.engine.core.test_exactness_sampled import (KNOB_CHOICES, VOCAB, dense_drafter, Solo,
                                                      dense_engine, draw_params, same_logprobs)

pytestmark = pytest.mark.timeout(300)
THREADS, REQUESTS = 4, 30
ROUNDS = int(os.environ.get("ROSEPLAY_EXACT_ROUNDS", 3))     # more: a longer hunt


@pytest.fixture(scope="module")
def solo():
    s = Solo()
    yield s
    s.eng.close()


def client(loop: EngineLoop, solo: Solo, lock: threading.Lock, seed: int, results: list,
           prompts: list, errors: list) -> None:
    try:
        submit_and_meddle(loop, solo, lock, seed, results, prompts)
    except BaseException as exc:     # (a thread's exception would go unseen)
        errors.append(exc)
        raise


def submit_and_meddle(loop: EngineLoop, solo: Solo, lock: threading.Lock, seed: int,
                      results: list, prompts: list) -> None:
    rng = random.Random(seed)
    for i in range(REQUESTS):
        if prompts and rng.random() < 0.5:
            prompt = rng.choice(prompts)
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            prompts.append(prompt)
        params = draw_params(rng, speculating=True)
        with lock:       # the solo engine is not thread-safe
            want = solo.run(prompt, params)
        try:
            stream = loop.submit({"prompt_token_ids": prompt}, params,
                                 request_id=f"t{seed}-{i}")
        except InvalidRequestError:       # can never fit this pool
            continue
        act = rng.random()
        if act < 0.1:
            stream.cancel()
        elif act < 0.15:                   # dropped by its consumer: cancelled
            del stream
            gc.collect()
            continue
        elif act < 0.3:
            loop.set_knobs(**{k: rng.choice(v) for k, v in KNOB_CHOICES.items()
                              if rng.random() < 0.5},
                           num_speculative_tokens=rng.choice([0, 1, 3]))
        elif act < 0.35:
            loop.send_command(ResetPrefixCache())
        elif act < 0.4:
            loop.pause()
            for _ in range(rng.randint(1, 3)):
                assert loop.step_once().wait(60)
            loop.resume()
        if rng.random() < 0.5:           # else several in flight from this thread
            results.append((stream.result(timeout=120), want, params))
        else:
            results.append((stream, want, params))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_concurrent_clients_get_their_solo_tokens(solo, round_):
    rng = random.Random(round_)
    eng = dense_engine(rng.randint(14, 24), 4, host_blocks=rng.choice([0, 8]),
                       max_num_batched_tokens=rng.choice([3, 8, 64]), max_num_seqs=8,
                       num_speculative_tokens=1, async_scheduling=True,
                       proposer=dense_drafter(0.6, round_))
    loop = EngineLoop(eng)
    lock, results, prompts, errors = threading.Lock(), [], [], []
    threads = [threading.Thread(target=client, args=(loop, solo, lock, round_ * THREADS + s,
                                                     results, prompts, errors))
               for s in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert len(results) >= THREADS * REQUESTS // 2
        for out, want, params in results:
            if not hasattr(out, "outputs"):
                out = out.result(timeout=120)
            got = out.outputs[0]
            assert got.finish_reason in (want.reason, "cancelled"), (out.error, params)
            assert list(got.token_ids) == want.tokens[:len(got.token_ids)], params
            if got.finish_reason != "cancelled":
                assert list(got.token_ids) == want.tokens, params
            if params.logprobs is not None:
                for a, b in zip(got.logprobs, want.logprobs):
                    assert same_logprobs(a, b), (params, got.token_ids, a, b)
        assert loop.wait_idle(60)
        loop.send_command(ResetPrefixCache())
        assert loop.wait_idle(60)
        assert not eng.requests and eng.pool.num_free == eng.pool.num_blocks
        assert eng.host is None or eng.host.pool.num_free == eng.host.num_blocks
        assert eng.structured.active == 0
        sampler = eng.executor.runner.sampler
        assert not sampler.generators and not sampler.counts.slots
    finally:
        loop.close()

"""Exactness under random operation sequences: no request's greedy tokens depend on what
other requests, cancels or live knobs do.

Seeded random sequences of submits (fresh prompts, several identical copies at once:
dedup followers; repeats of earlier prompts: prefix hits), single steps, cancels, live
knob changes (budget, max_num_seqs, prefix caching, the three scheduling modes and
policies, eviction, speculative k) and prefix-cache clears, on small pools (preemption,
copy-on-write), with or without a host tier (offload, reload, swap preemption), with
async scheduling on or off and drafts that are right with a drawn
chance (tests/engine/core/kv_checking.py: the model is a deterministic function of the
context and the KV cache is checked on every read). After every operation, every
request's tokens are a prefix of its solo run's, a finished one's are all of them, and
no step failed.

tests/engine/core/test_property.py explores the same engine with hypothesis' rule
choice; uniform random operations reach states that choice rarely does, such as a cancel
landing right after the step that launched a dedup leader's last prompt chunk (a fixed
set of seeds: a landing never depends on luck)."""
from __future__ import annotations

import random

import pytest

from engine.config import (EVICTION_POLICIES, PREEMPTION_MODES, SCHEDULING_MODES,
                           SCHEDULING_POLICIES)
from engine.config import InvalidRequestError
from engine.request import SamplingParams
from tests.engine.core.kv_checking import OracleDrafter, check_all, expected, make_engine
from tests.helpers import add_request

SEEDS = range(48)
OPS = 40
KNOB_CHOICES = dict(max_num_batched_tokens=[1, 2, 3, 8, 64, 512], max_num_seqs=[1, 2, 8, 64],
                    enable_prefix_caching=[True, True, False], scheduling_mode=SCHEDULING_MODES,
                    scheduling_policy=SCHEDULING_POLICIES, eviction_policy=EVICTION_POLICIES,
                    num_speculative_tokens=[0, 1, 3], preemption_mode=PREEMPTION_MODES)


class Run:
    """One random sequence: the engine, its requests and their solo runs' outputs."""

    def __init__(self, seed: int):
        self.rng = rng = random.Random(seed)
        self.eng = make_engine(rng.randint(6, 24), rng.choice([1, 2, 4, 8]),
                               max_num_batched_tokens=rng.choice([1, 3, 8, 32, 512]),
                               max_num_seqs=rng.choice([1, 2, 4, 64]),
                               num_speculative_tokens=rng.choice([0, 1, 3]),
                               async_scheduling=rng.random() < 0.7,
                               host_blocks=rng.choice([0, 0, 4, 16]),
                               proposer=OracleDrafter(rng.choice([0.0, 0.6, 1.0]), seed))
        self.prompts: list[list[int]] = []
        self.reqs: dict = {}         # id -> (Request, solo tokens, solo finish reason)

    def submit(self) -> None:
        rng = self.rng
        if self.prompts and rng.random() < 0.5:
            prompt = rng.choice(self.prompts)
        else:
            prompt = [rng.randrange(512) for _ in range(rng.randint(1, 30))]
            self.prompts.append(prompt)
        params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=0,
                                ignore_eos=rng.random() < 0.8)
        for _ in range(rng.randint(1, 3)):
            rid = f"r{len(self.reqs)}"
            try:
                req = add_request(self.eng, {"prompt_token_ids": prompt}, params, request_id=rid,
                                  priority=rng.randint(-1, 1))
            except InvalidRequestError:      # can never fit this pool (checked elsewhere)
                return
            self.reqs[rid] = (req, *expected(prompt, params, self.eng.eos_token_ids))

    def operate(self) -> None:
        rng, eng = self.rng, self.eng
        op = rng.random()
        if op < 0.25:
            self.submit()
        elif op < 0.35 and eng.requests:
            eng.abort(rng.choice(sorted(eng.requests)))
        elif op < 0.45:
            changes = {k: rng.choice(v) for k, v in KNOB_CHOICES.items() if rng.random() < 0.5}
            eng.set_knobs(eng.knobs.replace(**changes))
        elif op < 0.5:
            eng.clear_prefix_cache()
        else:
            eng.step()
        check_all(eng)
        self.check_outputs()

    def check_outputs(self) -> None:
        for rid, (req, want, reason) in self.reqs.items():
            got = [t for t in req.output_token_ids if t >= 0]      # (a pending one: unread)
            assert got == want[:len(got)], f"{rid}: {got} is not a prefix of {want}"
            if req.finish_reason in ("length", "stop"):
                assert (got, req.finish_reason) == (want, reason), rid

    def drain(self) -> None:
        for _ in range(3000):
            if not self.eng.has_unfinished():
                break
            self.eng.step()
            check_all(self.eng)
        assert not self.eng.has_unfinished(), "the engine did not drain"
        self.check_outputs()
        assert all(r.finish_reason in ("length", "stop", "cancelled")
                   for r, _, _ in self.reqs.values())
        self.eng.clear_prefix_cache()
        assert self.eng.pool.num_free == self.eng.pool.num_blocks
        host = self.eng.host
        assert host is None or host.pool.num_free == host.num_blocks


@pytest.mark.parametrize("seed", SEEDS)
def test_random_operations_never_change_a_requests_tokens(seed):
    run = Run(seed)
    for _ in range(OPS):
        run.operate()
    run.drain()

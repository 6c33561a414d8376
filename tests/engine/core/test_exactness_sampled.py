"""Exactness of sampled, processed and constrained requests under random operations: a
seeded request's tokens, a greedy one's under penalties, logit_bias, min_tokens or a
grammar, and every token's logprobs equal those of the same request run alone, whatever
other requests, cancels, live knobs (budget, max_num_seqs, prefix caching, scheduling,
preemption mode, speculative k) and cache clears do; with or without a host tier and
async scheduling. tests/engine/core/test_exactness.py covers greedy requests with a
one-hot model; here the fake model ranks every token (DenseRunner), so masks, penalties,
bias and sampling change what it picks; some runs poison a token (a forward whose
context holds it raises: only such requests may end with an error), and odd seeds keep
steady decode columns from one decode on (MIN_DECODES 1). After every operation the KV
events so far (KVMirror: what a router reads) describe each tier's prefix index; after
the drain no block, host slot, grammar or sampler state is left."""
from __future__ import annotations

import random

import pytest
import torch

from engine.config import (EVICTION_POLICIES, PREEMPTION_MODES, SCHEDULING_MODES,
                           SCHEDULING_POLICIES)
from engine.config import InvalidRequestError
from engine.core import decode_scheduling, scheduler
from engine.core.kv.kv_events import REMOVED, STORED
from engine.request import SamplingParams
from tests.engine.core.kv_checking import (VOCAB, KVCheckingRunner, OracleDrafter, check_all,
                                           context_hash, make_engine, run_ops)
from tests.helpers import add_request

SEEDS = range(48)
OPS = 60
KNOB_CHOICES = dict(max_num_batched_tokens=[1, 2, 3, 8, 64, 512], max_num_seqs=[1, 2, 8, 64],
                    enable_prefix_caching=[True, True, False], scheduling_mode=SCHEDULING_MODES,
                    scheduling_policy=SCHEDULING_POLICIES, eviction_policy=EVICTION_POLICIES,
                    preemption_mode=PREEMPTION_MODES)
# bounded constraints over the synthetic byte-level vocabulary of dummy:tiny
GRAMMARS = [{"regex": "[a-d]{1,3}(,[0-9]{1,2}){0,3}"}, {"choice": ["yes", "no", "maybe so"]},
            {"json": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                             "maximum": 99}},
                      "required": ["n"], "additionalProperties": False}},
            {"regex": "(ab|cd)+"}]


def dense_row(ctx: list[int]) -> torch.Tensor:
    """The fake model's logits: a deterministic ranking of every token for a context."""
    seed = context_hash(ctx)
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


class DenseRunner(KVCheckingRunner):
    poison: int | None = None      # a forward with this token in a context raises

    def logits(self, contexts):
        if not contexts:
            return torch.zeros(0, self.vocab)
        if self.poison is not None and any(self.poison in ctx for ctx in contexts):
            raise RuntimeError(f"poison token {self.poison}")
        return torch.stack([dense_row(ctx) for ctx in contexts])


def dense_drafter(accept: float, seed: int) -> OracleDrafter:
    """Drafts the dense model's argmax with chance `accept` (a Proposer)."""
    return OracleDrafter(accept, seed, model=lambda ctx: int(dense_row(ctx).argmax()))


def dense_engine(num_blocks: int, block_size: int, **kw):
    return make_engine(num_blocks, block_size, runner=DenseRunner, **kw)


def draw_params(rng: random.Random, speculating: bool) -> SamplingParams:
    """Greedy or seeded, with any mix of the processed fields and a grammar. Under
    speculation a seeded request is exact only when not speculated: it asks logprobs
    (docs/SPECULATIVE.md "What is exact")."""
    kw = dict(max_tokens=rng.randint(1, 20), ignore_eos=rng.random() < 0.5)
    if rng.random() < 0.5:
        kw.update(temperature=rng.choice([0.5, 1.0, 1.5]), seed=rng.randrange(2 ** 32),
                  top_k=rng.choice([-1, 5, 50]), top_p=rng.choice([1.0, 0.9]))
    else:
        kw.update(temperature=0)
    if rng.random() < 0.3:
        kw.update(logprobs=rng.choice([0, 3]), raw_logprobs=rng.random() < 0.3)
    if rng.random() < 0.25:
        kw.update(presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.3)
    if rng.random() < 0.2:
        kw.update(logit_bias={rng.randrange(VOCAB): 5.0, rng.randrange(VOCAB): -100.0})
    if rng.random() < 0.15:
        kw.update(min_tokens=rng.randint(0, kw["max_tokens"]), min_p=0.05)
    if rng.random() < 0.2:
        kw.update(stop_token_ids=[rng.randrange(VOCAB) for _ in range(3)])
    if rng.random() < 0.35:
        kw.update(structured_outputs=rng.choice(GRAMMARS))
    if speculating and "seed" in kw and "logprobs" not in kw:
        kw.update(logprobs=0)
    return SamplingParams(**kw)


class KVMirror:
    """What a router knows of each tier's prefix index from the engine's KV events."""

    def __init__(self):
        self.tiers: dict[str, set[int]] = {}

    def apply(self, events) -> None:
        for ev in events:
            if ev[0] == STORED:
                tier = self.tiers.setdefault(ev[4], set())
                assert not tier.intersection(ev[1]), "a block stored twice"
                tier.update(ev[1])
            elif ev[0] == REMOVED:
                tier = self.tiers.setdefault(ev[2], set())
                assert tier.issuperset(ev[1]), "an unknown block removed"
                tier.difference_update(ev[1])
            else:
                self.tiers.clear()

    def check(self, eng) -> None:
        """The events so far (published and pending) describe each tier's index."""
        now = KVMirror()
        now.tiers = {m: set(t) for m, t in self.tiers.items()}
        now.apply(eng.kv_events.pending)
        for pool in (eng.pool, eng.host and eng.host.pool):
            if pool:
                want = {int(pool.block_hash[b]) for b in pool.index.blocks()}
                assert now.tiers.get(pool.medium, set()) == want, f"{pool.medium} events"


class Stream:
    """A request's emitted tokens and logprobs, as the front receives them."""

    def __init__(self):
        self.tokens, self.logprobs, self.reason, self.error = [], [], None, None

    def take(self, out, rid: str) -> None:
        for i, r in enumerate(out.request_ids):
            if r == rid:
                self.tokens.append(out.token_ids[i])
                self.logprobs.append(None if out.logprobs is None else out.logprobs[i])
        for f in out.finished:
            if f.request_id == rid:
                self.reason, self.error = f.finish_reason, f.error


def same_logprobs(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (a.token_ids == b.token_ids and a.rank == b.rank
            and all(abs(x - y) <= 1e-5 or x == y for x, y in zip(a.logprobs, b.logprobs))
            and same_logprobs(a.raw, b.raw))


class Solo:
    """Each request alone on an engine of its own knobs (big pool, no host tier)."""

    def __init__(self, backend: str = "guidance"):
        self.backend = backend          # the grammar library (both engines use it)
        self.eng = dense_engine(64, 4, max_num_batched_tokens=512, max_num_seqs=64,
                                async_scheduling=False,
                                structured_outputs_config={"backend": backend})
        self.n = 0

    def run(self, prompt, params) -> Stream:
        self.n += 1
        rid = f"solo{self.n}"
        add_request(self.eng, {"prompt_token_ids": prompt}, params, request_id=rid)
        s = Stream()
        while self.eng.has_unfinished():
            s.take(self.eng.step(), rid)
        assert s.reason in ("length", "stop"), (s.reason, s.error)
        return s


class Run:
    def __init__(self, seed: int, solo: Solo):
        self.rng = rng = random.Random(seed)
        self.solo = solo
        self.speculating = rng.random() < 0.4
        self.eng = dense_engine(rng.randint(6, 24), rng.choice([1, 2, 4, 8]),
                                max_num_batched_tokens=rng.choice([1, 3, 8, 32, 512]),
                                max_num_seqs=rng.choice([1, 2, 4, 64]),
                                num_speculative_tokens=rng.choice([1, 3]) if self.speculating
                                else 0,
                                async_scheduling=rng.random() < 0.7,
                                host_blocks=rng.choice([0, 0, 4, 16]),
                                proposer=dense_drafter(rng.choice([0.0, 0.6, 1.0]), seed),
                                kv_events_config={"enable_kv_cache_events": True},
                                structured_outputs_config={"backend": solo.backend})
        self.kv = KVMirror()
        self.eng.kv_events.sink = lambda seq, ts, events: self.kv.apply(events)
        self.poison = rng.randrange(VOCAB) if rng.random() < 0.3 else None
        self.eng.executor.runner.poison = self.poison
        self.prompts: list[list[int]] = []
        self.reqs: dict[str, tuple] = {}     # id -> (Stream, solo Stream, params, prompt)

    def submit(self) -> None:
        rng = self.rng
        if self.prompts and rng.random() < 0.5:
            prompt = rng.choice(self.prompts)
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            if self.poison is not None and rng.random() < 0.2:
                prompt[rng.randrange(len(prompt))] = self.poison
            self.prompts.append(prompt)
        params = draw_params(rng, self.speculating)
        seeds = [params.seed]
        if params.seed is not None and rng.random() < 0.3:    # n > 1: seed + i each
            seeds += [params.seed + 1, params.seed + 2]
        elif rng.random() < 0.3:                              # identical copies (dedup)
            seeds += [params.seed]
        for seed in seeds:
            p = params if seed == params.seed else params.replace(seed=seed)
            rid = f"r{len(self.reqs)}"
            try:
                add_request(self.eng, {"prompt_token_ids": prompt}, p, request_id=rid)
            except InvalidRequestError:      # can never fit this pool
                return
            self.reqs[rid] = (Stream(), self.solo.run(prompt, p), p, prompt)

    def step(self, out) -> None:
        for rid, (s, _, _, _) in self.reqs.items():
            if s.reason is None:
                s.take(out, rid)

    def operate(self) -> None:
        rng, eng = self.rng, self.eng
        op = rng.random()
        if op < 0.3:
            self.submit()
        elif op < 0.37 and eng.requests:
            self.step(eng.abort_output(rng.choice(sorted(eng.requests))))
        elif op < 0.45:
            choices = dict(KNOB_CHOICES, num_speculative_tokens=[0, 1, 3] if self.speculating
                           else [0])
            changes = {k: rng.choice(v) for k, v in choices.items() if rng.random() < 0.5}
            eng.set_knobs(eng.knobs.replace(**changes))
        elif op < 0.5:
            eng.clear_prefix_cache()
        else:
            self.step(eng.step())
        self.check()

    def check(self) -> None:
        """check_all; a poisoned run's forward faults are expected (the stats say so)."""
        if self.poison is not None:
            self.eng.stats.last_error = None
        check_all(self.eng)
        self.kv.check(self.eng)
        self.check_outputs()

    def check_outputs(self) -> None:
        for rid, (s, want, params, prompt) in self.reqs.items():
            n = len(s.tokens)
            assert s.tokens == want.tokens[:n], \
                f"{rid} {params}: {s.tokens} is not a prefix of {want.tokens}"
            for i, (a, b) in enumerate(zip(s.logprobs, want.logprobs)):
                assert same_logprobs(a, b), f"{rid} token {i}: logprobs {a} != {b}"
            # a fault fails only a request whose own context held the poison
            poisoned = self.poison is not None and self.poison in prompt + want.tokens
            assert s.reason in (None, "cancelled", want.reason) + ("error",) * poisoned, \
                (rid, s.reason, s.error)
            if s.reason in ("length", "stop"):
                assert s.tokens == want.tokens, rid

    def drain(self) -> None:
        eng = self.eng
        for _ in range(3000):
            if not eng.has_unfinished():
                break
            self.step(eng.step())
            self.check()
        self.step(eng.flush())
        assert not eng.has_unfinished(), "the engine did not drain"
        self.check_outputs()
        assert all(s.reason in ("length", "stop", "cancelled", "error")
                   for s, _, _, _ in self.reqs.values())
        eng.clear_prefix_cache()
        assert eng.pool.num_free == eng.pool.num_blocks
        assert eng.host is None or eng.host.pool.num_free == eng.host.num_blocks
        assert eng.structured.active == 0 and not eng.structured.compiling
        sampler = eng.executor.runner.sampler
        assert not sampler.generators and not sampler.counts.slots, \
            (sorted(sampler.generators), sorted(sampler.counts.slots))


@pytest.fixture(scope="module")
def solo():
    s = Solo()
    yield s
    s.eng.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_operations_never_change_a_sampled_or_constrained_requests_tokens(
        seed, solo, monkeypatch):
    if seed % 2:     # steady decode columns from the first decode on (steady_decodes.py)
        for module in (scheduler, decode_scheduling):
            monkeypatch.setattr(module, "MIN_DECODES", 1)
    run_ops(Run(seed, solo), OPS)


@pytest.fixture(scope="module")
def xsolo():
    s = Solo("xgrammar")
    yield s
    s.eng.close()


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_on_the_xgrammar_backend(seed, xsolo):
    """The same with xgrammar's matchers (drafts checked token by token, then rolled
    back; a finished matcher asked nothing)."""
    run_ops(Run(1000 + seed, xsolo), OPS)



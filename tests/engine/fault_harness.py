"""Shared harness of the fault tests: a tiny checkpoint, reference runs, and two ways to
drive the engine one step at a time (LLMEngine.step() and a paused EngineLoop)."""

import os
import time

import pytest
import torch

from engine import LLM, EngineLoop, SamplingParams
from tests.hf_models import make_checkpoint

BS = 4
VOCAB = 320
DEVICE = os.environ.get("ROSEPLAY_TEST_DEVICE", "cpu")   # "cuda": same tests on a GPU
TIMEOUT = 30


def sp(n=8):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


_REF: dict = {}


def reference(ckpt, p, n):
    """Greedy tokens of prompt p alone, on a roomy engine (cached per prompt)."""
    key = (tuple(p), n)
    if key not in _REF:
        if "llm" not in _REF:
            _REF["llm"] = LLM(model=ckpt, device=DEVICE, dtype="float32", block_size=16,
                              num_blocks=128, max_num_seqs=1, enable_prefix_caching=False)
        out = _REF["llm"].generate([{"prompt_token_ids": p}], sp(n))[0]
        _REF[key] = list(out.outputs[0].token_ids)
    return _REF[key]


def engine_kw(**kw):
    args = dict(device=DEVICE, dtype="float32", block_size=BS, num_blocks=64,
                max_num_batched_tokens=64, check_invariants=True)
    args.update(kw)
    return args


def assert_all_free(eng):
    eng.check_invariants()
    assert not eng.has_unfinished()
    eng.clear_prefix_cache()
    pool = eng.pool
    pool.check([])
    assert pool.num_free == pool.num_blocks and (pool.refcounts == 0).all()


# -- two ways to drive the engine one step at a time ----------------------------------

class EngineHarness:
    """LLMEngine driven directly."""

    def __init__(self, ckpt, **kw):
        self.llm = LLM(model=ckpt, **engine_kw(**kw))
        self.engine = self.llm.engine
        self.reqs = {}

    def submit(self, p, params, rid):
        self.reqs[rid] = self.llm.add_request({"prompt_token_ids": p}, params, request_id=rid)

    def step(self):
        self.engine.step()

    def cancel(self, rid):
        self.engine.abort(rid)

    def req(self, rid):
        return self.reqs[rid]

    def finish(self, rid):
        """Run until rid ends; return (finish_reason, token_ids, error)."""
        r = self.reqs[rid]
        for _ in range(2000):
            if r.status.done:
                return r.finish_reason, list(r.output_token_ids), r.error
            self.engine.step()
        raise AssertionError(f"{rid} did not finish")

    def close(self):
        pass


class LoopHarness:
    """EngineLoop paused, stepped with step_once(); requests looked up in its engine."""

    def __init__(self, ckpt, **kw):
        self.loop = EngineLoop(model=ckpt, **engine_kw(**kw))
        self.loop.pause()
        self.engine = self.loop.engine
        self.streams = {}
        self.reqs = {}

    def submit(self, p, params, rid):
        # paused again (finish() resumes): a running loop could add and finish the request
        # between two polls below, and it would never be seen in engine.requests
        self.loop.pause()
        self.streams[rid] = self.loop.submit({"prompt_token_ids": p}, params, request_id=rid)
        deadline = time.monotonic() + TIMEOUT      # the engine thread adds it asynchronously
        while rid not in self.engine.requests:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        self.reqs[rid] = self.engine.requests[rid]

    def step(self):
        assert self.loop.step_once().wait(TIMEOUT)
        self._sync()

    def _sync(self):
        for rid in self.streams:      # remember the Request objects the engine holds
            if rid in self.engine.requests:
                self.reqs[rid] = self.engine.requests[rid]

    def cancel(self, rid):
        self._sync()
        self.loop.cancel(rid)
        out = self.streams[rid].result(timeout=TIMEOUT)   # the cancel ran on the engine thread
        assert out.finished

    def req(self, rid):
        self._sync()
        return self.reqs[rid]

    def finish(self, rid):
        self.loop.resume()
        out = self.streams[rid].result(timeout=TIMEOUT)
        return out.outputs[0].finish_reason, list(out.outputs[0].token_ids), out.error

    def close(self):
        self.loop.resume()
        assert self.loop.wait_idle(TIMEOUT)
        assert self.loop.fatal_error is None
        self.loop.close()


@pytest.fixture(params=["engine", "loop"])
def make(request, ckpt):
    made = []

    def factory(**kw):
        h = (EngineHarness if request.param == "engine" else LoopHarness)(ckpt, **kw)
        made.append(h)
        return h
    yield factory
    for h in made:
        h.close()


def run_until(h, cond, limit=200):
    for _ in range(limit):
        if cond():
            return
        h.step()
    raise AssertionError("stage never reached")


def check_cancelled(h, rid, min_tokens=0):
    reason, tokens, _ = h.finish(rid)
    assert reason == "cancelled"
    assert len(tokens) >= min_tokens
    return tokens


def fail_once(monkeypatch, obj, name, exc, when=lambda *a, **k: True):
    """Make obj.name raise exc on the first call where when(...) holds; then behave."""
    real = getattr(obj, name)
    state = {"fired": 0}

    def wrapper(*args, **kwargs):
        if not state["fired"] and when(*args, **kwargs):
            state["fired"] += 1
            raise exc
        return real(*args, **kwargs)
    monkeypatch.setattr(obj, name, wrapper)
    return state

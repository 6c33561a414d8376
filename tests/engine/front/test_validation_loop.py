"""Abuse at the API boundary, the engine's side: bad live knobs and engine arguments are
refused with a clear InvalidRequestError, and EngineLoop.submit raises in the caller's
thread while a running loop serves the good requests with unchanged greedy tokens
(SamplingParams and prompts: test_validation.py).
"""
from __future__ import annotations

import threading

import pytest

from engine import LLM, EngineLoop, InvalidRequestError, SamplingParams
from engine.config import SchedulerConfig, make_config
from tests.engine.front.test_validation import VOCAB, good_prompts
from tests.helpers import GREEDY, refused


# -- live knobs ---------------------------------------------------------------------------

BAD_KNOBS = [
    (dict(max_num_batched_tokens=0), r"max_num_batched_tokens must be an integer in \[1, \d+\], got 0"),
    (dict(max_num_batched_tokens=-1), r"max_num_batched_tokens must be an integer in \[1, \d+\], got -1"),
    (dict(max_num_batched_tokens="a"), r"max_num_batched_tokens must be an integer in \[1, \d+\], got 'a'"),
    (dict(max_num_batched_tokens=1.5), r"max_num_batched_tokens must be an integer in \[1, \d+\]"),
    (dict(max_num_batched_tokens=True), r"max_num_batched_tokens must be an integer in \[1, \d+\], got True"),
    (dict(max_num_batched_tokens=None), r"max_num_batched_tokens must be an integer in \[1, \d+\]"),
    (dict(max_num_seqs=0), r"max_num_seqs must be an integer in \[1, \d+\], got 0"),
    (dict(max_num_seqs="8"), r"max_num_seqs must be an integer in \[1, \d+\], got '8'"),
    (dict(enable_prefix_caching="off"), r"enable_prefix_caching must be a bool, got 'off'"),
    (dict(enable_prefix_caching=0), r"enable_prefix_caching must be a bool, got 0"),
    (dict(block_size=8), r"unknown knob\(s\): block_size"),
    (dict(budget=64), r"unknown knob\(s\): budget"),
    (dict(max_num_seqs=4, turbo=True), r"unknown knob\(s\): turbo"),
]


@pytest.mark.parametrize("changes, match", BAD_KNOBS, ids=lambda v: repr(v)[:50])
def test_bad_knobs_are_refused(changes, match):
    refused(match, SchedulerConfig().replace, **changes)
    if set(changes) <= set(SchedulerConfig.__dataclass_fields__):
        refused(match, SchedulerConfig, **changes)      # the constructor checks the same


def test_loop_refuses_bad_knobs_in_caller_and_keeps_serving(ckpt):
    prompts = good_prompts(8, seed=5)
    sp = SamplingParams(max_tokens=5, **GREEDY)
    kw = dict(device="cpu", dtype="float32", block_size=8, num_blocks=64)
    ref = [o.outputs[0].token_ids for o in LLM(model=str(ckpt), **kw).generate(prompts, sp)]
    with EngineLoop(model=str(ckpt), **kw, max_num_batched_tokens=32) as loop:
        before = loop.engine.knobs
        streams = []
        for i, p in enumerate(prompts):
            streams.append(loop.submit(p, sp))
            changes, match = BAD_KNOBS[i % len(BAD_KNOBS)]
            refused(match, loop.set_knobs, **changes)
        assert [s.result(timeout=60).outputs[0].token_ids for s in streams] == ref
        assert loop.wait_idle(10)
        assert loop.engine.knobs == before          # nothing half-applied
        loop.set_knobs(max_num_batched_tokens=7)    # a good one still works
        assert loop.step_once().wait(10)
        assert loop.engine.knobs.max_num_batched_tokens == 7
        assert loop.fatal_error is None


# -- EngineLoop: raise in the caller's thread, serve the good ones unchanged ----------------

def test_submit_raises_in_caller_thread(ckpt):
    with EngineLoop(model=str(ckpt), device="cpu", dtype="float32", num_blocks=16,
                    block_size=8, max_model_len=200) as loop:
        caught = {}

        def worker():
            try:
                loop.submit([VOCAB + 1])
            except InvalidRequestError as exc:
                caught["exc"], caught["thread"] = exc, threading.current_thread()

        t = threading.Thread(target=worker)
        t.start()
        t.join(10)
        assert caught["thread"] is t
        assert "token ids must be in [0, 320)" in str(caught["exc"])
        refused(r"prompt has 200 tokens; max_model_len is 200", loop.submit, [7] * 200)
        refused(r"prompt \+ max_tokens = 129 tokens can never fit the KV pool "
                r"\(16 blocks x 8 = 128 tokens\)", loop.submit, [1], SamplingParams(max_tokens=128))
        refused(r"max_tokens must be an integer in \[1, ", lambda: loop.submit([1], SamplingParams(max_tokens=0)))
        assert loop.engine.requests == {} and not loop.core._commands


def test_loop_interleaved_bad_and_good_submissions(ckpt):
    prompts = good_prompts(24, seed=11)
    sp = SamplingParams(max_tokens=8, **GREEDY)
    kw = dict(device="cpu", dtype="float32", block_size=8, num_blocks=24, max_model_len=256)
    ref = [o.outputs[0].token_ids for o in LLM(model=str(ckpt), **kw).generate(prompts, sp)]
    bad = [
        ([], sp, r"prompt is empty"),
        ("hello", sp, r"has no tokenizer"),
        ([0, VOCAB], sp, r"token ids must be in \[0, 320\)"),
        (list(range(256)), sp, r"max_model_len is 256"),
        ([5] * 150, SamplingParams(max_tokens=100), r"250 tokens can never fit the KV pool"),
        ([1, 2.0], sp, r"must be integers"),
        ({"prompt_token_ids": 3}, sp, r"prompt_token_ids must be a list of integers"),
        ([1], dict(max_tokens=3), r"params must be a SamplingParams"),
    ]
    with EngineLoop(model=str(ckpt), **kw, max_num_batched_tokens=24, max_num_seqs=6) as loop:
        streams = []
        for i, p in enumerate(prompts):
            streams.append(loop.submit(p, sp))
            prompt, params, match = bad[i % len(bad)]
            refused(match, loop.submit, prompt, params)
        outs = [s.result(timeout=60) for s in streams]
        assert [o.outputs[0].token_ids for o in outs] == ref
        assert all(o.outputs[0].finish_reason == "length" and o.error is None for o in outs)
        assert loop.wait_idle(10)
        eng = loop.engine
        assert eng.stats.counters.errors == 0 and loop.fatal_error is None
        loop.reset_prefix_cache()
        assert loop.wait_idle(10)
        eng.check_invariants()
        assert eng.pool.num_free == eng.pool.num_blocks


def test_loop_duplicate_request_id_is_refused_at_submit(ckpt):
    """As EngineClient (engine/front/api.py): a live id raises; the live request is intact."""
    sp = SamplingParams(max_tokens=6, **GREEDY)
    with EngineLoop(model=str(ckpt), device="cpu", dtype="float32", block_size=8,
                    num_blocks=32) as loop:
        loop.pause()
        first = loop.submit([1, 2, 3], sp, request_id="same")
        with pytest.raises(InvalidRequestError, match="duplicate request id 'same'"):
            loop.submit([4, 5, 6], sp, request_id="same")
        import gc
        gc.collect()                            # the refused stream: must not cancel the first
        loop.resume()
        out1 = first.result(timeout=30)
        assert out1.outputs[0].finish_reason == "length"
        assert len(out1.outputs[0].token_ids) == 6


def test_make_config_rejects_nothing_valid():
    cfg = make_config(model="dummy:tiny", num_gpu_blocks=10, max_num_seqs=3)
    assert cfg.num_blocks == 10 and cfg.scheduler.max_num_seqs == 3


@pytest.mark.parametrize("name", ["enforce_eager", "async_scheduling", "check_invariants",
                                  "calculate_kv_scales", "enable_prefix_caching"])
def test_bool_knobs_take_bools_only(name):
    """LLM(enforce_eager="no") was taken, as a true value: every bool knob refuses
    anything but a bool, naming it."""
    for value in ("no", 0, 1, None):
        refused(rf"{name} must be a bool, got {value!r}", make_config, model="dummy:tiny",
                **{name: value})

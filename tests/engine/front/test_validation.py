"""Abuse at the API boundary: every bad input is refused with a clear InvalidRequestError
(a ValueError) that says what is wrong, and the engine keeps serving everyone else.

Covers SamplingParams and prompts (empty, too long, never fits the pool, ids outside the
vocabulary, wrong types, text without a tokenizer); live knobs, engine arguments and
EngineLoop.submit raising in the caller's thread are in test_validation_loop.py (model
names and broken checkpoints: test_checkpoints.py).
"""
from __future__ import annotations

import enum

import msgspec
import numpy as np
import pytest
import torch

from engine import LLM, InvalidRequestError, SamplingParams
from engine.config import SpeculativeConfig, make_config
from engine.validation import MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY, MIN_TOP_P
from tests.helpers import GREEDY, refused

VOCAB = 320          # tests.hf_models "llama"


@pytest.fixture(scope="module")
def tiny():
    """dummy:tiny (vocab 512, no tokenizer) with a small pool: 8 blocks x 4 = 32 tokens."""
    return LLM(model="dummy:tiny", device="cpu", dtype="float32", block_size=4, num_blocks=8,
               max_model_len=64, check_invariants=True)


def good_prompts(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(k),), generator=g).tolist()
            for k in torch.randint(1, 40, (n,), generator=g)]


# -- SamplingParams -------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), r"max_tokens must be an integer in \[1, 2147483647\], got 0"),
    (dict(max_tokens=-5), r"max_tokens must be an integer in \[1, 2147483647\], got -5"),
    (dict(max_tokens=1.5), r"max_tokens must be an integer in \[1, 2147483647\], got 1\.5"),
    (dict(max_tokens="3"), r"max_tokens must be an integer in \[1, 2147483647\], got '3'"),
    (dict(max_tokens=True), r"max_tokens must be an integer in .*, got True"),
    (dict(temperature=-0.1), r"temperature must be in \[0, 10000\.0\], got -0\.1"),
    (dict(temperature=float("inf")), r"temperature must be in \[0, 10000\.0\], got inf"),
    (dict(temperature="hot"), r"temperature must be a number, got 'hot'"),
    (dict(temperature=float("nan")), r"temperature must be a number"),
    (dict(temperature=True), r"temperature must be a number, got True"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0\.0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1\.5"),
    (dict(top_p=-0.2), r"top_p must be in \(0, 1\]"),
    (dict(top_p=float("nan")), r"top_p must be a number"),
    (dict(top_p="0.9"), r"top_p must be a number, got '0.9'"),
    (dict(top_k=-2), r"top_k must be an integer in \[-1, 2147483647\], got -2"),
    (dict(top_k=2.5), r"top_k must be an integer in .*, got 2\.5"),
    (dict(top_k="5"), r"top_k must be an integer"),
    (dict(seed=-2**63 - 1), r"seed must be an integer in \[-9223372036854775808, 18446744073709551615\], got -9223372036854775809"),
    (dict(seed="7"), r"seed must be an integer"),
    (dict(seed=2**64), r"seed must be an integer in \[-9223372036854775808, 18446744073709551615\]"),
    (dict(stop=[""]), r"stop must be a non-empty string"),
    (dict(stop=[3]), r"stop must be a non-empty string"),
    (dict(stop_token_ids=[-1]), r"stop_token_ids entry must be an integer in \[0, 2147483647\], got -1"),
    (dict(stop_token_ids=["a"]), r"stop_token_ids entry must be an integer"),
    (dict(top_k=2**63), r"top_k must be an integer in \[-1, 2147483647\], got 9223372036854775808"),
    (dict(max_tokens=10**30), r"max_tokens must be an integer in \[1, 2147483647\]"),
    (dict(stop_token_ids=[2**64]), r"stop_token_ids entry must be an integer in \[0, 2147483647\]"),
    (dict(stop_token_ids=list(range(1025))), r"stop_token_ids: at most 1024 entries"),
    (dict(stop=["ok", "\ud800"]), r"stop is not valid Unicode \(lone surrogate at position 0\)"),
    (dict(ignore_eos="yes"), r"ignore_eos must be a boolean"),
    # in range as Python floats, but 0 or infinite in the sampler's float32
    (dict(top_p=1e-300), r"top_p must be at least 1\.175e-38 \(float32's smallest normal"),
    (dict(top_p=1e-46), r"top_p must be at least 1\.175e-38"),
    (dict(top_p=2.0 ** -127), r"top_p must be at least 1\.175e-38"),
    (dict(repetition_penalty=1e-300), r"repetition_penalty must be in \[0\.0001, 10000\.0\]"),
    (dict(repetition_penalty=1e-40), r"repetition_penalty must be in \[0\.0001, 10000\.0\]"),
    (dict(repetition_penalty=0), r"repetition_penalty must be in \[0\.0001, 10000\.0\], got 0"),
    (dict(raw_logprobs=1, logprobs=1), r"raw_logprobs must be a boolean, got 1"),
    (dict(raw_logprobs="yes", logprobs=1), r"raw_logprobs must be a boolean, got 'yes'"),
], ids=lambda v: repr(v) if isinstance(v, dict) else "")
def test_bad_sampling_params_are_refused(kwargs, match):
    refused(match, SamplingParams, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(max_tokens=1), dict(temperature=0), dict(temperature=0.0), dict(top_p=1.0),
    dict(top_p=1e-6), dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(seed=0),
    dict(stop="x"), dict(stop_token_ids=[0]), dict(top_p=MIN_TOP_P),
    dict(repetition_penalty=MIN_REPETITION_PENALTY), dict(repetition_penalty=1e4),
])
def test_edge_sampling_params_are_accepted(kwargs):
    SamplingParams(**kwargs)


def test_smallest_top_p_and_repetition_penalty_stay_finite_in_float32():
    """The bounds are float32's: top_p's floor is not 0 there, and the strongest
    repetition penalty scales a logit by 1e4 at most (the max 1e4 does the same)."""
    assert MIN_TOP_P == float(np.finfo(np.float32).tiny) == float(np.float32(MIN_TOP_P))
    assert np.float32(1e-46) == 0 and np.float32(1e-300) == 0       # the values refused
    logits = np.array([-3e4, 3e4], np.float32)
    assert np.isfinite(logits / np.float32(MIN_REPETITION_PENALTY)).all()
    assert np.isfinite(logits * np.float32(MAX_REPETITION_PENALTY)).all()


WRONG_TYPES = [True, 1, 0.5, "1", None, [], [1], ["a"], {}, {"1": 1.0}, {1: 1.0}, {1: "x"},
               ("a",), (1,), b"x", -1, float("nan")]


@pytest.mark.parametrize("name", SamplingParams.__struct_fields__)
def test_sampling_params_types_are_as_strict_in_python_as_on_the_wire(name):
    """SamplingParams(**{name: value}) refuses exactly what decoding it from the engine
    process's wire refuses: a value the Python API takes is never refused later."""
    base = {"logprobs": 1} if name == "raw_logprobs" else {}
    encode = msgspec.msgpack.Encoder().encode
    for value in WRONG_TYPES:
        try:
            SamplingParams(**base, **{name: value})
            python_ok = True
        except InvalidRequestError:
            python_ok = False
        try:
            msgspec.msgpack.decode(encode({**base, name: value}), type=SamplingParams)
            wire_ok = True
        except msgspec.ValidationError:
            wire_ok = False
        assert python_ok == wire_ok, (name, value, python_ok, wire_ok)


@pytest.mark.parametrize("text, match", [
    ('{"method": ["x"]}', r"method must be a string, got \['x'\]"),
    ('{"method": {}}', r"method must be a string"),
    ('{"method": "oracle"}', r"method must be one of ngram, draft_model, got 'oracle'"),
    ('{"oracle_acceptance": 0.5}', r"unknown speculative_config field\(s\): oracle_acceptance"),
    ('{"num_speculative_tokens": "3"}', r"num_speculative_tokens must be an integer"),
    ('{"prompt_lookup_min": null}', r"prompt_lookup_min"),
    ('{"model": []}', r"model must be a non-empty string"),
    ("[" * 100_000, r"speculative_config is not JSON"),
    ('"ngram"', r"speculative_config must be an object"),
], ids=lambda v: v[:30])
def test_bad_speculative_config_values_are_refused(text, match):
    """Each is an InvalidRequestError (the CLI's exit status 2), never a TypeError."""
    refused(match, SpeculativeConfig.parse, text)
    refused(match, make_config, speculative_config=text)


# -- prompts ----------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, params, match", [
    ([], None, r"prompt is empty"),
    ((), None, r"prompt is empty"),
    ("", None, r"prompt is empty"),
    ({"prompt_token_ids": []}, None, r"prompt is empty"),
    ({"prompt": "hi"}, None, r"has no tokenizer.*prompt_token_ids"),
    ({"prompt": 5}, None, r"needs 'prompt_token_ids' \(a list of integers\) or 'prompt'"),
    ({}, None, r"needs 'prompt_token_ids' \(a list of integers\) or 'prompt'"),
    ({"prompt_token_ids": 5}, None, r"prompt_token_ids must be a list of integers"),
    ({"prompt_token_ids": None}, None, r"prompt_token_ids must be a list of integers"),
    # vLLM's other prompt keys were ignored: the output ran without what they ask
    ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": 0}}, None,
     r"a dict prompt's 'multi_modal_data' is not supported by this engine"),
    ({"prompt_token_ids": [1, 2], "cache_salt": "u1"}, None, r"'cache_salt' is not supported"),
    ({"prompt_token_ids": [1, 2], "promt": "typo"}, None, r"'promt' is not supported"),
    ("To be or not", None, r"has no tokenizer.*prompt_token_ids"),
    ([512], None, r"token ids must be in \[0, 512\); got min 512, max 512"),
    ([1, 2, -1], None, r"token ids must be in \[0, 512\); got min -1"),
    ([1, 10**12], None, r"token ids must be in \[0, 512\)"),
    ([1.5], None, r"prompt_token_ids must be integers"),
    (["3"], None, r"prompt_token_ids must be integers"),
    ([True, 1], None, r"prompt_token_ids must be integers"),
    ([[1, 2]], None, r"prompt_token_ids must be integers"),
    (None, None, r"prompt must be a string or token ids, got NoneType"),
    (5, None, r"prompt must be a string or token ids, got int"),
    (b"abc", None, r"prompt must be a string or token ids, got bytes"),
    ([1, 2], SamplingParams(stop="END"), r"has no tokenizer: stop strings can never match"),
    (list(range(64)), None, r"prompt has 64 tokens; max_model_len is 64"),
    (list(range(300)), None, r"prompt has 300 tokens; max_model_len is 64"),
    # capacity 8 blocks x 4 = 32 tokens: 20 + 13 = 33 can never be held at once
    (list(range(20)), SamplingParams(max_tokens=13), r"33 tokens can never fit the KV pool "
                                                     r"\(8 blocks x 4 = 32 tokens\)"),
    ([1, 2, 3], {"max_tokens": 4}, r"params must be a SamplingParams"),
], ids=lambda v: repr(v)[:40])
def test_bad_prompts_are_refused(tiny, prompt, params, match):
    refused(match, tiny.inputs.process, prompt, params)
    # ([5] alone is one token prompt, as in vLLM: the int goes beside another prompt)
    refused(match, tiny.generate, [prompt, [1]] if isinstance(prompt, int) else [prompt],
            params)
    assert not tiny.engine.has_unfinished()


def test_int_subclass_ids_still_pass(tiny):
    """An int subclass passes, as it always has (bool, the one subclass refused, is in
    the table above): the one-pass check must not narrow what a prompt may be."""
    class Tok(enum.IntEnum):
        A, B = 3, 7
    creq, _ = tiny.inputs.process([Tok.A, Tok.B, 5], None)
    assert creq.prompt_token_ids == (3, 7, 5)


def test_generate_refuses_bad_batches_atomically(tiny):
    """LLM.generate validates every prompt before adding any."""
    sp = SamplingParams(max_tokens=2, **GREEDY)
    refused(r"token ids must be in", tiny.generate, [[1, 2], [3, 999], [4]], sp)
    refused(r"sampling_params has 1 entries for 2 prompts", tiny.generate, [[1], [2]], [sp])
    refused(r"sampling_params must be a SamplingParams or a list of them, got dict",
            tiny.generate, [[1]], {"max_tokens": 3})
    refused(r"sampling_params must be a SamplingParams or a list of them, got int",
            tiny.generate, [[1]], 3)
    refused(r"got a list holding int", tiny.generate, [[1]], frozenset([0]))   # (AttributeError)
    # (a list of ints alone is one token prompt, as in vLLM: test_llm_vllm_args.py)
    refused(r"prompt must be a string or token ids, got int", tiny.generate, [1, "a"], sp)
    assert not tiny.engine.has_unfinished()
    assert [len(o.outputs[0].token_ids) for o in tiny.generate([[1, 2], [3]], [sp, sp])] == [2, 2]


def test_fits_exactly_is_accepted(tiny):
    # 20 + 12 = 32 tokens = the whole pool: accepted, and it runs to the end alone
    out = tiny.generate([list(range(20))], SamplingParams(max_tokens=12, **GREEDY))
    assert len(out[0].outputs[0].token_ids) == 12
    # the need is min(prompt + max_tokens, max_model_len): with max_model_len 64 > 32,
    # a huge max_tokens can never fit, even after a 1-token prompt
    refused(r"prompt \+ max_tokens = 64 tokens can never fit", tiny.inputs.process, [1],
            SamplingParams(max_tokens=10**6))
    tiny.engine.clear_prefix_cache()
    assert tiny.engine.pool.num_free == tiny.engine.pool.num_blocks


def test_odd_but_valid_sampling_does_not_disturb_the_batch(tiny):
    """Extreme valid params run next to a greedy request, which keeps its tokens;
    a near-zero temperature is greedy (not NaN logits -> token 0)."""
    greedy = SamplingParams(max_tokens=6, **GREEDY)
    ref = tiny.generate([[4, 5, 6]], greedy)[0].outputs[0].token_ids
    odd = [SamplingParams(max_tokens=6, temperature=1e-45, ignore_eos=True),
           SamplingParams(max_tokens=6, temperature=1e-6, ignore_eos=True),
           SamplingParams(max_tokens=6, temperature=1e4, ignore_eos=True),    # the maximum
           SamplingParams(max_tokens=6, temperature=9999.0, ignore_eos=True),
           SamplingParams(max_tokens=6, top_k=10**9, seed=2**64 - 1, ignore_eos=True),
           SamplingParams(max_tokens=6, top_p=1e-9, seed=0, ignore_eos=True),
           SamplingParams(max_tokens=6, top_k=1, temperature=5.0, ignore_eos=True)]
    outs = tiny.generate([[4, 5, 6]] * (len(odd) + 1), odd + [greedy])
    assert all(o.error is None and len(o.outputs[0].token_ids) == 6 for o in outs)
    assert outs[-1].outputs[0].token_ids == ref
    for i in (0, 1, 5, 6):          # all of these reduce to the argmax
        assert outs[i].outputs[0].token_ids == ref, odd[i]


def test_duplicate_request_id_is_refused(tiny):
    eng = tiny.engine
    a = tiny.add_request([1, 2, 3], SamplingParams(max_tokens=2, **GREEDY), request_id="dup")
    refused(r"duplicate request id 'dup'", tiny.add_request, [4, 5],
            SamplingParams(max_tokens=2, **GREEDY), request_id="dup")
    while eng.has_unfinished():
        eng.step()
    assert a.finish_reason == "length" and len(a.output_token_ids) == 2


def test_refusals_leave_the_engine_serving(ckpt):
    """Bad requests between good ones: the good ones' tokens do not change."""
    prompts = good_prompts()
    sp = SamplingParams(max_tokens=6, **GREEDY)
    kw = dict(device="cpu", dtype="float32", block_size=8, num_blocks=32, max_model_len=128,
              check_invariants=True)
    ref = [o.outputs[0].token_ids for o in LLM(model=str(ckpt), **kw).generate(prompts, sp)]
    llm = LLM(model=str(ckpt), **kw)
    eng = llm.engine
    bad = [([], sp), ([VOCAB], sp), (list(range(200)), sp), ([1, 2], "sp"),
           ({"prompt_token_ids": None}, sp), ("text", sp), ([0.5], sp)]
    reqs = []
    for i, p in enumerate(prompts):
        reqs.append(llm.add_request(p, sp))
        with pytest.raises(InvalidRequestError):
            llm.add_request(*bad[i % len(bad)])
        eng.step()
    while eng.has_unfinished():
        eng.step()
    assert [tuple(r.output_token_ids) for r in reqs] == ref
    eng.clear_prefix_cache()
    assert eng.pool.num_free == eng.pool.num_blocks


def test_generate_refuses_an_on_step_it_cannot_call(tiny):
    """It raised 'int object is not callable' after the requests had started."""
    refused("on_step must be callable, got int", tiny.generate, [[1, 2]], None, on_step=5)
    assert not tiny.engine.has_unfinished()


def test_sampling_params_take_keywords_only():
    """SamplingParams(2) was max_tokens=2 here and n=2 in vLLM (its first field)."""
    with pytest.raises(TypeError, match="positional"):
        SamplingParams(2)
    with pytest.raises(TypeError, match="detokenise"):      # a misspelt field, by name
        SamplingParams(detokenise=False)

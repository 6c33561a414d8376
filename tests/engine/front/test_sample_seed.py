"""One rule for a seeded request's samples (engine.request.sample_seed): sample i uses
seed + i, and the seed is refused when the last sample's would pass MAX_SEED; the
offline API (SamplingParams.n) and the server (n, best_of) share both, so they agree at
the top of the range (LLM.generate wrapped the last sample's seed to 0, the server
refused)."""
from __future__ import annotations

import msgspec
import pytest

from engine import LLM, InvalidRequestError, SamplingParams
from engine.validation import MAX_SEED
from roseplay.serve.protocol import CompletionRequest

EDGE = "seed must be at most 18446744073709551614 with 2 choices"
PROMPT = [5, 9, 11, 3]


def _completion(**fields) -> CompletionRequest:
    req = msgspec.json.decode(msgspec.json.encode({"model": "m", "prompt": "x", **fields}),
                              type=CompletionRequest)
    req.check_supported()
    return req


def test_llm_samples_at_the_top_seed():
    """n=2 from MAX_SEED - 1: samples MAX_SEED - 1 and MAX_SEED, each as run alone;
    from MAX_SEED the second sample has no seed: refused as SamplingParams is built."""
    with pytest.raises(InvalidRequestError, match=EDGE):
        SamplingParams(n=2, seed=MAX_SEED)
    with pytest.raises(InvalidRequestError, match=EDGE):
        SamplingParams(seed=MAX_SEED).replace(n=2)
    assert SamplingParams(n=1, seed=MAX_SEED).seed == MAX_SEED
    sp = SamplingParams(n=2, seed=MAX_SEED - 1, max_tokens=6, ignore_eos=True)
    with LLM(model="dummy:tiny", device="cpu", dtype="float32") as llm:
        both = llm.generate({"prompt_token_ids": PROMPT}, sp)[0].outputs
        for i, c in enumerate(both):
            alone = llm.generate({"prompt_token_ids": PROMPT},
                                 sp.replace(n=1, seed=MAX_SEED - 1 + i))[0].outputs[0]
            assert c.token_ids == alone.token_ids


def test_server_choices_at_the_top_seed():
    """The server's n and best_of count as the samples: the same bound and message, and
    choice i's SamplingParams carries seed + i."""
    with pytest.raises(InvalidRequestError, match=EDGE):
        _completion(seed=MAX_SEED, n=2)
    with pytest.raises(InvalidRequestError, match=EDGE.replace("14 with 2", "13 with 3")):
        _completion(seed=MAX_SEED - 1, n=1, best_of=3)
    req = _completion(seed=MAX_SEED - 2, n=1, best_of=3)
    assert [req.sampling_params(4, i).seed for i in range(3)] == \
        [MAX_SEED - 2, MAX_SEED - 1, MAX_SEED]
    assert _completion(seed=MAX_SEED).sampling_params(4).seed == MAX_SEED


def test_a_negative_seed_is_torchs_two_complement():
    """Any signed 64-bit seed, as vLLM's server takes it (a negative one was refused):
    torch seeds a generator with -1 as with 2**64 - 1, so the two sample alike; n=2
    from -1 samples -1 and 0; below -2**63 is refused."""
    sp = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0)
    with LLM(model="dummy:tiny", device="cpu", dtype="float32") as llm:
        def run(**kw):
            return [c.token_ids for c in
                    llm.generate({"prompt_token_ids": PROMPT}, sp.replace(**kw))[0].outputs]
        assert run(seed=-1) == run(seed=MAX_SEED) == run(seed=-1)
        assert run(seed=-1, n=2) == run(seed=-1) + run(seed=0)
    with pytest.raises(InvalidRequestError, match="seed must be an integer in "
                                                  r"\[-9223372036854775808, "):
        SamplingParams(seed=-2 ** 63 - 1)
    assert _completion(seed=-5, n=2).seed == -5

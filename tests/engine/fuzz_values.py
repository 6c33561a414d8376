"""Hypothesis strategies for fuzzing the public boundaries, the settings every fuzz test
uses (fixed seed, bounded examples: CI-stable and fast), and the invariant checked after
each case: the engine still serves a known greedy request with the same tokens and every
KV block is back in the pool."""
from __future__ import annotations

import itertools
import math
import os
from collections import Counter

import pytest

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from engine import SamplingParams
from tests.helpers import wait_for

# the engine both fuzz suites start (dummy:tiny: vocabulary of 512)
VOCAB = 512                 # dummy:tiny
ENGINE = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=4, num_blocks=32,
              max_model_len=64)

EXAMPLES = int(os.environ.get("ROSEPLAY_FUZZ_EXAMPLES", "1"))   # a multiplier for long runs


def fuzz_settings(n: int) -> settings:
    """derandomize: the same examples on every run (CI); deadline off (a busy box)."""
    return settings(derandomize=True, max_examples=n * EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])


# how many inputs each boundary saw, and how many it refused (docs/RELIABILITY.md)
TRIED: Counter = Counter()
REFUSED: Counter = Counter()


def report() -> str:
    return "\n".join(f"{name:28} tried {TRIED[name]:5}  refused {REFUSED[name]:5}"
                     for name in sorted(TRIED))


# -- values ------------------------------------------------------------------------------
class Odd:
    """An object no boundary knows (unhashable, no len, no iter)."""
    __hash__ = None


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(),
    st.sampled_from([-1, 0, 1, 2 ** 31, 2 ** 63, 2 ** 64, 10 ** 30, -(10 ** 30)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -0.0, 1e-45]),
    st.text(max_size=12), st.binary(max_size=8), st.builds(Odd))

ANYTHING = st.recursive(
    SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=6), inner, max_size=3),
        st.frozensets(st.integers(), max_size=3)),
    max_leaves=8)

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10)


def either(plausible, wild=ANYTHING):
    """Mostly plausible values (near the edges of the accepted range), sometimes anything."""
    return st.one_of(plausible, plausible, plausible, wild)


def token_ids(vocab: int, max_size: int = 40):
    ids = st.one_of(st.integers(min_value=0, max_value=vocab - 1),
                    st.sampled_from([-1, vocab, vocab + 1, 10 ** 12]))
    return st.lists(ids, max_size=max_size)


def prompts(vocab: int, text: bool = True):
    """Prompts in every shape the API takes, and shapes it must refuse."""
    ids = token_ids(vocab)
    good = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=30)
    shapes = [good, good.map(lambda t: {"prompt_token_ids": t}), ids, ids.map(tuple),
              st.fixed_dictionaries({"prompt_token_ids": either(ids)},
                                    optional={"prompt": either(st.text(max_size=20))}),
              st.dictionaries(st.text(max_size=10), ANYTHING, max_size=2), ANYTHING]
    if text:
        shapes.append(st.text(max_size=40))
    return st.one_of(*shapes)


SAMPLING_FIELDS = {
    "max_tokens": either(st.integers(min_value=-2, max_value=12)),
    "temperature": either(st.one_of(st.floats(min_value=-1, max_value=3),
                                    st.sampled_from([0.0, 1e-6, 1e4, 1e4 + 1, math.inf]))),
    "top_k": either(st.integers(min_value=-3, max_value=600)),
    "top_p": either(st.floats(min_value=-0.5, max_value=1.5)),
    "seed": either(st.one_of(st.none(), st.integers(min_value=-2, max_value=2 ** 65))),
    "stop": either(st.one_of(st.none(), st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3))),
    "stop_token_ids": either(st.one_of(st.none(), st.lists(st.integers(-2, 600), max_size=3))),
    "ignore_eos": either(st.booleans()),
}
SAMPLING_KWARGS = st.fixed_dictionaries({}, optional=SAMPLING_FIELDS)
VALID_SAMPLING_KWARGS = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(1, 12), "temperature": st.sampled_from([0.0, 0.5, 1.0, 1e4]),
    "top_k": st.integers(-1, 600), "top_p": st.floats(1e-6, 1.0),
    "seed": st.one_of(st.none(), st.integers(0, 2 ** 64 - 1)),
    "stop_token_ids": st.lists(st.integers(0, 600), max_size=3), "ignore_eos": st.booleans()})


@st.composite
def sampling_params(draw, valid_only: bool = False):
    """A SamplingParams built from fuzzed fields (None if they were refused), or, unless
    `valid_only`, a value of any other type."""
    if not valid_only and draw(st.integers(0, 4)) == 0:
        return draw(st.one_of(st.none(), ANYTHING))
    kwargs = draw(SAMPLING_KWARGS if draw(st.booleans()) else VALID_SAMPLING_KWARGS)
    try:
        return SamplingParams(**kwargs)
    except ValueError:
        return None


# -- the invariant ---------------------------------------------------------------------------
REF_PROMPT = {"prompt_token_ids": [5, 17, 42, 99, 3, 250, 7, 11]}
REF_PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
_ref_ids = itertools.count()


def still_serves(loop, reference: list[int]) -> None:
    """The engine behind `loop` (EngineLoop or EngineClient) serves the known greedy request
    with the reference tokens, and once idle with the prefix cache cleared every block is
    free (nothing leaked)."""
    assert loop.fatal_error is None, loop.fatal_error
    out = loop.submit(REF_PROMPT, REF_PARAMS, request_id=f"fuzz-ref-{next(_ref_ids)}").result(timeout=60)
    assert out.error is None, out.error
    assert list(out.outputs[0].token_ids) == reference, (out.outputs[0].finish_reason,
                                                         out.outputs[0].token_ids)
    loop.reset_prefix_cache()
    assert loop.wait_idle(60)

    def all_free() -> bool:
        snap = loop.snapshot()
        return snap.num_free == snap.num_blocks
    wait_for(all_free, 20, "every block back in the pool")


@pytest.fixture(scope="module")
def print_counts():
    """ROSEPLAY_FUZZ_REPORT=1: print how many inputs each boundary was tried with."""
    yield
    if os.environ.get("ROSEPLAY_FUZZ_REPORT"):
        print("\n" + report())

"""Property-based fuzzing (hypothesis, fixed seed, bounded examples) of the in-process
boundaries: SamplingParams, EngineLoop.submit / cancel / set_knobs, LLM.generate and the
CLI flags. Every input is either refused with InvalidRequestError (in the caller's
thread) or served; after each case the engine still serves a known greedy request with
the same tokens and no block leaked (tests/engine/fuzz_values.py). ROSEPLAY_FUZZ_REPORT=1 -s
prints how many inputs each boundary saw."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import LLM, EngineLoop, InvalidRequestError, SamplingParams
from engine.config import KNOB_MAXIMUM, SchedulerConfig, make_config
from engine.request import MAX_TEMPERATURE
from tests.engine import fuzz_values as F
from tests.engine.fuzz_values import ENGINE, VOCAB

pytestmark = pytest.mark.usefixtures("print_counts")   # tests/engine/conftest.py


@pytest.fixture(scope="module")
def loop():
    with EngineLoop(**ENGINE) as lp:
        yield lp


@pytest.fixture(scope="module")
def reference(loop):
    out = loop.submit(F.REF_PROMPT, F.REF_PARAMS).result(timeout=60)
    return list(out.outputs[0].token_ids)


def tried(boundary: str, fn, *args, **kwargs):
    """Call fn; count the input; return (result, refusal message or None). Any exception
    other than InvalidRequestError fails the test."""
    F.TRIED[boundary] += 1
    try:
        return fn(*args, **kwargs), None
    except InvalidRequestError as exc:
        F.REFUSED[boundary] += 1
        assert str(exc), "a refusal must say why"
        return None, str(exc)


# -- SamplingParams ------------------------------------------------------------------------
@F.fuzz_settings(300)
@given(st.one_of(F.SAMPLING_KWARGS, F.VALID_SAMPLING_KWARGS))
def test_sampling_params_refuse_or_hold_in_range(kwargs):
    sp, error = tried("SamplingParams", SamplingParams, **kwargs)
    if error:
        return
    assert isinstance(sp.max_tokens, int) and sp.max_tokens >= 1
    assert 0 <= sp.temperature <= MAX_TEMPERATURE and 0 < sp.top_p <= 1 and sp.top_k >= -1
    assert sp.seed is None or 0 <= sp.seed < 2 ** 64
    assert all(isinstance(s, str) and s for s in sp.stop)
    assert all(isinstance(t, int) and t >= 0 for t in sp.stop_token_ids)


# -- EngineLoop ----------------------------------------------------------------------------
@F.fuzz_settings(40)
@given(prompt=F.prompts(VOCAB), params=F.sampling_params(),
       request_id=st.one_of(st.none(), st.text(max_size=300), F.ANYTHING))
def test_submit_refuses_or_serves(loop, reference, prompt, params, request_id):
    stream, error = tried("EngineLoop.submit", loop.submit, prompt, params, request_id=request_id)
    if stream is not None:
        out = stream.result(timeout=60)
        comp = out.outputs[0]
        assert out.error is None and comp.finish_reason in ("stop", "length"), out.error
        assert 1 <= len(comp.token_ids) <= (params.max_tokens if params else 16)
    F.still_serves(loop, reference)


@F.fuzz_settings(40)
@given(st.one_of(F.ANYTHING, st.text(max_size=400)))
def test_cancel_refuses_or_is_a_no_op(loop, reference, request_id):
    tried("EngineLoop.cancel", loop.cancel, request_id)
    F.still_serves(loop, reference)


KNOB_VALUES = st.one_of(st.fixed_dictionaries({}, optional={
    "max_num_batched_tokens": F.either(st.one_of(
        st.integers(1, 64), st.integers(-2, 2 * KNOB_MAXIMUM["max_num_batched_tokens"]))),
    "max_num_seqs": F.either(st.one_of(
        st.integers(1, 16), st.integers(-2, 2 * KNOB_MAXIMUM["max_num_seqs"]))),
    "enable_prefix_caching": F.either(st.booleans())}),
    st.dictionaries(st.sampled_from(["block_size", "turbo", "num_blocks", ""]), F.ANYTHING,
                    min_size=1, max_size=2))


@F.fuzz_settings(40)
@given(KNOB_VALUES)
def test_set_knobs_refuses_or_applies_whole(loop, reference, changes):
    before = loop.knobs
    knobs, error = tried("EngineLoop.set_knobs", loop.set_knobs, **changes)
    if error:
        assert loop.knobs == before, "a refused change must change nothing"
    else:
        assert all(getattr(knobs, k) == v for k, v in changes.items())
        for f, top in KNOB_MAXIMUM.items():
            assert 1 <= getattr(knobs, f) <= top
    F.still_serves(loop, reference)
    loop.set_knobs(**dataclasses.asdict(SchedulerConfig()))


# -- LLM.generate ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm():
    return LLM(**ENGINE)


def llm_serves(llm: LLM, reference: list[int]) -> None:
    out = llm.generate([F.REF_PROMPT], F.REF_PARAMS)[0]
    assert list(out.outputs[0].token_ids) == reference
    assert not llm.engine.has_unfinished()
    llm.engine.clear_prefix_cache()
    pool = llm.engine.pool
    assert pool.num_free == pool.num_blocks


@F.fuzz_settings(40)
@given(prompts=st.one_of(F.prompts(VOCAB), st.lists(F.prompts(VOCAB), max_size=4)),
       params=st.one_of(F.sampling_params(), st.lists(F.sampling_params(valid_only=True), max_size=4)))
def test_generate_refuses_or_serves(llm, reference, prompts, params):
    if isinstance(params, list) and any(p is None for p in params):
        params = [p or SamplingParams(max_tokens=4) for p in params]
    outs, error = tried("LLM.generate", llm.generate, prompts, params)
    if outs is not None:
        for out in outs:
            assert out.error is None and out.outputs[0].finish_reason in ("stop", "length")
    llm_serves(llm, reference)


# -- CLI flags ---------------------------------------------------------------------------
def parsers() -> dict[str, argparse.ArgumentParser]:
    from roseplay import cli
    from roseplay.bench import args as bench_args
    from roseplay.serve import cli as serve_cli
    b = argparse.ArgumentParser(prog="roseplay bench")
    bench_args.add_arguments(b)
    return {"tui": cli.build_parser(), "bench": b, "serve": serve_cli.build_parser()}


PARSERS = parsers()
FLAG_VALUES = st.one_of(st.sampled_from(["0", "-1", "1", "2", "8", "64", "1.5", "nan", "inf",
                                         "-inf", "1e30", "10000000000000000000000", "abc", "",
                                         "true", "off", "dummy:tiny", "dummy:nope", "cpu",
                                         "tpu", "auto", "max_num_seqs=1,2", "turbo=1"]),
                        st.text(max_size=8))


@st.composite
def argv_for(draw, parser: argparse.ArgumentParser) -> list[str]:
    """Flags of `parser` each with a value where it takes one (sometimes a stray word)."""
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    argv = []
    for action in draw(st.lists(st.sampled_from(actions), max_size=5)):
        argv.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            choices = [str(c) for c in action.choices] if action.choices else []
            argv.append(draw(st.one_of(FLAG_VALUES, st.sampled_from(choices))
                             if choices else FLAG_VALUES))
    if draw(st.integers(0, 5)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(FLAG_VALUES))
    return argv


@F.fuzz_settings(200)
@given(data=st.data(), which=st.sampled_from(sorted(PARSERS)))
def test_cli_flags_exit_2_or_make_a_valid_config(data, which):
    """Every flag combination either ends in argparse's usage error (exit 2, one line
    on stderr) or parses into engine knobs that make_config accepts or refuses with
    InvalidRequestError: never a traceback."""
    from roseplay.cli_flags import engine_kwargs
    argv = data.draw(argv_for(PARSERS[which]))
    F.TRIED[f"CLI ({which})"] += 1
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = PARSERS[which].parse_args(argv)
    except SystemExit as exc:
        F.REFUSED[f"CLI ({which})"] += 1
        assert exc.code == 2 and "error:" in err.getvalue()
        return
    kwargs = engine_kwargs(args)
    _, error = tried(f"CLI ({which}) -> config", make_config, **kwargs)
    if error is None and which == "bench":
        from roseplay.bench.args import check_args, parse_ab
        try:
            check_args(args)
            parse_ab(args.ab)
        except ValueError:
            F.REFUSED[f"CLI ({which})"] += 1

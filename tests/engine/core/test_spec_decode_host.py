"""The host side of speculative decoding (docs/SPECULATIVE.md "Host cost"): the n-gram
proposer's incremental search equals the plain definition (a window scan per n, the
longest n first, its most recent match), each request's token array follows its
tokens as they grow, async scheduling chains the steps that verify nothing and launches
the step after a verify before that one's bookkeeping, verified
random rows cost the sampler no draw, and the verify graphs' widest step follows k,
max_num_seqs and the token budget."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.ngram_proposer import SEARCH_WINDOW, TokenArrays, propose_ngram


def _by_definition(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    if k <= 0 or len(tokens) < n_min + 1:
        return []
    t = np.asarray(tokens[-SEARCH_WINDOW:], dtype=np.int64)
    size = t.shape[0]
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        windows = sliding_window_view(t[:size - 1], n)
        hits = np.flatnonzero((windows == t[size - n:]).all(axis=1))
        if hits.shape[0]:
            start = int(hits[-1]) + n
            return t[start:start + k].tolist()
    return []


@pytest.mark.parametrize("vocab", [2, 5, 40])
def test_incremental_ngram_search_equals_the_definition(vocab):
    rng = np.random.default_rng(vocab)
    for _ in range(400):
        tokens = rng.integers(0, vocab, int(rng.integers(1, 60))).tolist()
        n_min = int(rng.integers(1, 4))
        n_max = int(rng.integers(n_min, 6))
        k = int(rng.integers(0, 6))
        assert propose_ngram(tokens, k, n_min, n_max) == \
            _by_definition(tokens, k, n_min, n_max), (tokens, k, n_min, n_max)
    long = rng.integers(0, vocab, SEARCH_WINDOW + 300).tolist()     # past the window
    assert propose_ngram(long, 4, 1, 4) == _by_definition(long, 4, 1, 4)


class _Req:
    def __init__(self, prompt):
        self.prompt_token_ids, self.output_token_ids = list(prompt), []


def test_token_arrays_follow_the_tokens_as_they_grow():
    arrays, req = TokenArrays(), _Req(range(50))
    assert arrays.get(req).tolist() == list(range(50))
    for step in range(100):                    # 1 to 4 tokens a step, past the capacity
        req.output_token_ids.extend(range(1000 + step, 1000 + step + 1 + step % 4))
        assert arrays.get(req).tolist() == req.prompt_token_ids + req.output_token_ids
    other = _Req([7, 8])
    assert arrays.get(other).tolist() == [7, 8]
    del req
    assert len(arrays._arrays) == 1            # weakly keyed: gone with its request


def test_async_scheduling_chains_steps_that_verify_nothing():
    """Async scheduling on, speculation on: steps without a verify are launched before
    the previous step's tokens are read (at most SPEC_ASYNC_RUN in a row), steps with one
    are not; greedy tokens equal the plain engine's and drafts are still accepted."""
    from engine import LLM, SamplingParams
    from engine.core.spec_decode import SPEC_ASYNC_RUN
    line = "To be, or not to be, that is the question.\n"
    prompts = [line * 3, "ROMEO.\nBut soft, what light through yonder window breaks?",
               "KING.\nWhat news? " * 5, "O"]
    kw = dict(model="default", device="cpu", max_num_batched_tokens=32, async_scheduling=True,
              check_invariants=True)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    with LLM(**kw) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with LLM(speculative_config=spec, **kw) as llm:
        eng, chained, runs = llm.engine, [], []
        launch_next = eng._launch_next

        def spy(prev):
            assert not prev.plan.verifies          # never after a verify
            chained.append(1)
            runs.append(eng._chained)
            return launch_next(prev)
        eng._launch_next = spy
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        accepted = eng.counters.spec_decode_num_accepted_tokens
    assert got == want and accepted > 0
    assert len(chained) >= 5 and max(runs) <= SPEC_ASYNC_RUN


def test_the_step_after_a_verify_is_launched_before_its_bookkeeping():
    """Async scheduling on: a verify step is left in flight like any step; the next call
    reads its tokens, plans and launches the next step, and only then records the
    verify step (stats, events) and returns its outputs, so that this work and the
    caller's processing of them overlap the next step's device work (docs/SPECULATIVE.md
    "Async scheduling"). Greedy tokens equal the plain engine's."""
    from engine import LLM, SamplingParams
    line = "To be, or not to be, that is the question.\n"
    prompts = [line * 3, "KING.\nWhat news? " * 5]
    kw = dict(model="default", device="cpu", async_scheduling=True, check_invariants=True)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    with LLM(**kw) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with LLM(speculative_config=spec, **kw) as llm:
        eng, log = llm.engine, []
        launch, record = eng._launch, eng._record

        def spy_launch(plan, *args, **kw):
            log.append(("launch", id(plan), bool(plan.verifies)))
            return launch(plan, *args, **kw)

        def spy_record(plan, *args):
            log.append(("record", id(plan), bool(plan.verifies)))
            return record(plan, *args)
        eng._launch, eng._record = spy_launch, spy_record
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        accepted = eng.counters.spec_decode_num_accepted_tokens
    assert got == want and accepted > 0
    launches = [(i, e[1]) for i, e in enumerate(log) if e[0] == "launch"]
    checked = 0
    for (at, plan), (next_at, _) in zip(launches, launches[1:]):
        if log[at][2]:            # a verify plan, and a step launched after it
            recorded = next(i for i in range(at, len(log))   # (ids are reused)
                            if log[i][:2] == ("record", plan))
            assert next_at < recorded, log[at:recorded + 1]
            checked += 1
    assert checked >= 5


_LINE = "To be, or not to be, that is the question.\n"
_SPEC_KW = dict(model="default", device="cpu", async_scheduling=True, check_invariants=True)


def _spec_llm():
    from engine import LLM
    return LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **_SPEC_KW)


def _tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def test_a_failed_launch_after_a_verify_is_rerun_request_by_request():
    """The step launched after a verify's tokens were read (_launch_settled) fails once
    (a transient fault): it is rerun request by request, nobody fails, the error is
    reported, the tokens are the plain engine's and every block comes back."""
    from engine import LLM, SamplingParams
    prompts = [_LINE * 3, "KING.\nWhat news? " * 5]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    with LLM(**_SPEC_KW) as llm:
        want = _tokens(llm.generate(prompts, params))
    with _spec_llm() as llm:
        eng, state = llm.engine, {"settling": False, "failed": 0}
        settled, execute = eng._launch_settled, eng.executor.runner.execute_model

        def settle():
            state["settling"] = True
            try:
                return settled()
            finally:
                state["settling"] = False

        def flaky(batch):
            if state["settling"] and not state["failed"] and batch.num_decodes > 1:
                state["failed"] = 1
                raise RuntimeError("transient")
            return execute(batch)
        eng._launch_settled, eng.executor.runner.execute_model = settle, flaky
        got = llm.generate(prompts, params)
        assert state["failed"] and "transient" in eng.stats.last_error
        assert _tokens(got) == want and all(o.outputs[0].finish_reason == "length" for o in got)
        assert eng.pool.num_used == 0 and eng._inflight is None


def test_a_failed_token_read_of_a_verify_fails_its_requests_only(monkeypatch):
    """Reading an in-flight verify step's tokens fails (the device died mid-run): its
    requests end with the error, no step is launched after it, every block is freed,
    and the engine then serves the same prompts with the plain engine's tokens."""
    from engine import LLM, SamplingParams
    prompts = [_LINE * 3, "KING.\nWhat news? " * 5]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    with LLM(**_SPEC_KW) as llm:
        want = _tokens(llm.generate(prompts, params))
    with _spec_llm() as llm:
        eng, failed, after = llm.engine, [], []
        real, step = eng._emit_tokens, eng.step

        def emit(launched, out):
            if launched.plan.verifies and eng._inflight is None and not failed:
                failed.append(launched)
                raise RuntimeError("device lost")
            return real(launched, out)

        def watched():
            out = step()
            if failed and not after:          # the call whose read failed
                after.append(eng._inflight)
            return out
        monkeypatch.setattr(eng, "_emit_tokens", emit)
        monkeypatch.setattr(eng, "step", watched)
        got = llm.generate(prompts, params)
        errored = [o for o in got if o.outputs[0].finish_reason == "error"]
        assert failed and errored and all("device lost" in o.error for o in errored)
        assert after == [None]                # nothing was launched after it
        for o, tokens in zip(got, want):
            assert list(o.outputs[0].token_ids) == tokens[:len(o.outputs[0].token_ids)]
        assert eng.pool.num_used == 0 and not eng.requests and eng._inflight is None
        monkeypatch.setattr(eng, "_emit_tokens", real)
        assert _tokens(llm.generate(prompts, params)) == want


def test_verified_random_rows_spend_no_sampler_draw():
    """temperature > 0: the rejection sampler draws a verify row's token, so the sampler
    skips those rows: a step whose sample rows all verify makes no random draw of its own."""
    from engine import LLM, SamplingParams
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with LLM(model="default", device="cpu", speculative_config=spec,
             async_scheduling=False) as llm:
        runner = llm.engine.executor.runner
        draws, verify_only = [], []
        execute, draw = runner.execute_model, runner.sampler._sample_random

        def counted_draw(*args):
            draws.append(1)
            return draw(*args)

        def watched(batch):
            before = len(draws)
            tokens = execute(batch)
            if batch.draft_rows is not None and \
                    batch.draft_rows.shape[0] == batch.sample_rows.shape[0]:
                verify_only.append(len(draws) == before)
            return tokens
        runner.sampler._sample_random, runner.execute_model = counted_draw, watched
        out = llm.generate(["To be, or not to be, that is the question.\n" * 3],
                           SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 30
    assert verify_only and all(verify_only) and draws      # plain decode steps still draw


def test_verify_graph_rows_follow_k_the_seqs_and_the_budget():
    from engine.config import make_config
    from engine.worker.executor.setup import verify_rows
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    assert verify_rows(make_config(max_num_seqs=32, speculative_config=spec,
                                   max_num_batched_tokens=2048)) == 32 * 5
    assert verify_rows(make_config(max_num_seqs=32, speculative_config=spec,
                                   max_num_batched_tokens=64)) == 64   # drafts in the budget
    assert verify_rows(make_config(max_num_seqs=32, max_num_batched_tokens=16,
                                   num_speculative_tokens=2)) == 32    # decodes uncapped
    assert verify_rows(make_config(max_num_seqs=32)) == 0
    # no verify step past disable_by_batch_size requests (default 32; null: never off)
    assert verify_rows(make_config(max_num_seqs=256, num_speculative_tokens=3,
                                   max_num_batched_tokens=8192)) == 32 * 4
    never = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None}
    assert verify_rows(make_config(max_num_seqs=256, speculative_config=never,
                                   max_num_batched_tokens=8192)) == 256 * 4
    assert verify_rows(make_config(max_num_seqs=256, max_num_batched_tokens=8192,
                                   speculative_config={**never, "disable_by_batch_size": 8})) \
        == 8 * 4

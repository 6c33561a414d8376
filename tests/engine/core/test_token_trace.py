"""Token traces (engine/core/token_trace.py, engine/outputs.py TokenTrace): a finished
request's output token by token for the TUI's scrub. The logprobs kept are exactly the
ones streamed for each token (processed and raw); speculative origins match the
verifies (accepted drafts, then the target's bonus or correction, all emitted at the
verify's one time); memory stays bounded (TRACE_KEEP traces of each kind, TRACE_TOKENS
tokens each); requests that asked for neither have none."""
import pytest

from benchmarks.oracle import OracleProposer
from engine.config import make_config
from engine.core import spec_decode, stats as stats_mod, token_trace
from engine.core.core import LLMEngine
from engine import request as request_mod
from engine.request import SamplingParams
from engine.outputs import TOKEN_BONUS, TOKEN_CORRECTION, TOKEN_DRAFT, TOKEN_PLAIN
from tests.helpers import add_request

ENGINE = dict(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=128,
              block_size=8, max_num_batched_tokens=64, max_num_seqs=8)
GREEDY = dict(temperature=0, ignore_eos=True)


def _prompt(k, n=12):
    return {"prompt_token_ids": [(k * 7 + i) % 500 + 1 for i in range(n)]}


def _serve(eng):
    """Step until done; each request's streamed (token, logprobs), in order."""
    streamed: dict[str, list] = {}
    while eng.has_unfinished():
        out = eng.step()
        lps = out.logprobs or [None] * len(out.token_ids)
        for rid, tok, lp in zip(out.request_ids, out.token_ids, lps):
            streamed.setdefault(rid, []).append((tok, lp))
    assert not eng.flush().token_ids
    return streamed


@pytest.fixture
def engine():
    eng = LLMEngine(make_config(**ENGINE))
    yield eng
    eng.close()


def test_the_trace_keeps_each_streamed_tokens_logprobs(engine):
    reqs = [add_request(engine, _prompt(1), SamplingParams(max_tokens=6, logprobs=3,
                                                          raw_logprobs=True, **GREEDY), "raw"),
            add_request(engine, _prompt(2), SamplingParams(max_tokens=5, logprobs=2,
                                                          temperature=0.9, seed=3), "lp"),
            add_request(engine, _prompt(3), SamplingParams(max_tokens=5, **GREEDY), "none")]
    streamed = _serve(engine)
    snap = engine.snapshot()
    assert sorted(t.request_id for t in snap.traces) == ["lp", "raw"]
    assert snap.trace("none") is None
    for req in reqs[:2]:
        trace, got = snap.trace(req.request_id), streamed[req.request_id]
        assert len(trace) == trace.num_tokens == len(got) == len(req.output_token_ids)
        assert trace.ids().tolist() == [t for t, _ in got] == req.output_token_ids
        assert trace.token_times().tolist() == req.token_times
        assert trace.top == req.params.logprobs + 1
        for i, (_, lp) in enumerate(got):
            assert trace.logprobs_at(i) == lp          # ids, values, rank and raw alike
        assert (trace.logprobs_at(0).raw is not None) == req.params.raw_logprobs
        codes, drafts = trace.origins()
        assert set(codes.tolist()) == {TOKEN_PLAIN} and not drafts.any()
        assert trace.logprobs_at(len(got)) is None


def test_traces_are_bounded(engine, monkeypatch):
    for mod in (request_mod, token_trace, spec_decode):
        monkeypatch.setattr(mod, "TRACE_TOKENS", 3)
    params = SamplingParams(max_tokens=6, logprobs=1, **GREEDY)
    n = stats_mod.TRACE_KEEP + 3
    reqs = [add_request(engine, _prompt(k), params, f"r{k}") for k in range(n)]
    streamed = _serve(engine)
    traces = engine.snapshot().traces
    assert len(traces) == stats_mod.TRACE_KEEP
    assert all(len(r.logprobs_trace) == 3 for r in reqs)
    for t in traces:
        assert len(t) == 3 and t.num_tokens == 6
        assert t.ids().tolist() == [tok for tok, _ in streamed[t.request_id][:3]]
        assert t.logprobs_at(2) == streamed[t.request_id][2][1]
    kept = {t.request_id for t in traces}          # the latest to finish
    dropped = [r.token_times[-1] for r in reqs if r.request_id not in kept]
    assert min(r.token_times[-1] for r in reqs if r.request_id in kept) >= max(dropped)


def test_speculative_origins_follow_the_verifies():
    """The oracle drafts the target's own greedy tokens, each kept with p = 0.5: verifies
    accept some drafts and reject others."""
    prompts = [_prompt(k, 10) for k in range(4)]
    params = SamplingParams(max_tokens=24, **GREEDY)
    ref = LLMEngine(make_config(**ENGINE))
    try:
        base = [add_request(ref, p, params, f"b{i}") for i, p in enumerate(prompts)]
        _serve(ref)
        refs = [(p["prompt_token_ids"], r.output_token_ids) for p, r in zip(prompts, base)]
    finally:
        ref.close()
    eng = LLMEngine(make_config(num_speculative_tokens=3, **ENGINE),
                    proposer=OracleProposer(refs, 0.5))
    try:
        reqs = [add_request(eng, p, params, f"s{i}") for i, p in enumerate(prompts)]
        _serve(eng)
        snap = eng.snapshot()
    finally:
        eng.close()
    assert snap.spec_method == "oracle"
    for req, (_, expected) in zip(reqs, refs):
        trace = snap.trace(req.request_id)
        assert trace.ids().tolist() == expected == req.output_token_ids   # greedy: the same
        codes, drafts = trace.origins()
        times = trace.token_times()
        assert (codes == TOKEN_DRAFT).sum() == req.num_accepted_tokens
        assert sum(d for _, _, d, _ in req.spec_trace) == req.num_draft_tokens > 0
        for first, emitted, drafted, accepted in req.spec_trace:
            group = slice(first, first + emitted)
            assert (drafts[group] == drafted).all()
            assert (times[group] == times[first]).all()      # one verify: one emission time
            kinds = codes[group].tolist()
            assert kinds[:accepted] == [TOKEN_DRAFT] * min(accepted, emitted)
            if emitted == accepted + 1:
                assert kinds[-1] == (TOKEN_BONUS if accepted == drafted else TOKEN_CORRECTION)
        plain = codes == TOKEN_PLAIN
        assert not drafts[plain].any()
        assert 0 < req.num_accepted_tokens < req.num_draft_tokens    # p = 0.5: both kinds


def test_a_request_that_asks_gets_its_trace_in_its_final_output(engine):
    """However many traced requests end after it (the snapshot keeps only TRACE_KEEP of
    them), a request with token_trace gets its own trace in its FinishedRequest, even
    with no logprobs; the others' carry none."""
    greedy = dict(max_tokens=6, **GREEDY)
    mine = add_request(engine, _prompt(0), SamplingParams(token_trace=True, **greedy), "mine")
    for k in range(1, stats_mod.TRACE_KEEP + 3):
        add_request(engine, _prompt(k), SamplingParams(logprobs=1, **greedy), f"o{k}")
    finished = {}
    while engine.has_unfinished():
        finished.update((f.request_id, f) for f in engine.step().finished)
    finished.update((f.request_id, f) for f in engine.flush().finished)
    trace = finished.pop("mine").trace
    assert trace.ids().tolist() == mine.output_token_ids and trace.num_tokens == 6
    assert trace.token_times().tolist() == mine.token_times
    assert trace.top == 0 and trace.logprobs_at(0) is None
    assert set(trace.origins()[0].tolist()) == {TOKEN_PLAIN}
    assert len(finished) == stats_mod.TRACE_KEEP + 2
    assert all(f.trace is None for f in finished.values())
    assert engine.snapshot().trace("mine") is None      # the window has moved on


def test_a_traced_requests_view_outlives_the_finished_window(monkeypatch):
    """Snapshots show the latest RECENT_FINISHED ended requests, then the latest
    RECENT_TRACED that asked for their trace beyond them, each once."""
    from engine.core import core as core_mod
    monkeypatch.setattr(core_mod, "RECENT_FINISHED", 2)
    eng = LLMEngine(make_config(**ENGINE))
    try:
        greedy = dict(max_tokens=4, **GREEDY)
        add_request(eng, _prompt(0), SamplingParams(token_trace=True, **greedy), "mine")
        _serve(eng)
        for k in range(1, 5):
            add_request(eng, _prompt(k), SamplingParams(**greedy), f"o{k}")
            _serve(eng)
        ids = [v.request_id for v in eng.snapshot().requests]
        assert ids == ["o3", "o4", "mine"]
        assert eng.snapshot().request("mine").state == "finished"
        add_request(eng, _prompt(9), SamplingParams(token_trace=True, **greedy), "again")
        _serve(eng)
        assert [v.request_id for v in eng.snapshot().requests] == ["o4", "again", "mine"]
    finally:
        eng.close()


def test_an_ended_requests_view_is_built_once_by_a_snapshot(engine):
    """A step that ends requests builds no view of them (W1's end: 16 a step, mostly
    never shown); the first snapshot views each as it ended (finished, its tokens, its
    blocks given back) and every later one shows that same view."""
    greedy = dict(max_tokens=5, **GREEDY)
    reqs = [add_request(engine, _prompt(k), SamplingParams(**greedy), f"e{k}") for k in range(3)]
    _serve(engine)
    assert all(type(item) is request_mod.Request for item in engine.recent_finished)
    first = engine.snapshot()
    for req in reqs:
        view = first.request(req.request_id)
        assert view.state == "finished" and view.finish_reason == "length"
        assert view.output_tokens == 5 and view.blocks == () and view.computed_tokens == 0
        assert view.output_tail == tuple(req.output_token_ids) and view.ttft is not None
    again = engine.snapshot()
    assert all(again.request(r.request_id) is first.request(r.request_id) for r in reqs)

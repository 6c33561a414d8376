"""A launch that fails after its sampling drew (here: taking its logprobs) is rerun
request by request (StepFaults._isolate): the rerun draws as if the failed launch had
never drawn, so a seeded request's tokens, and a penalized one's, equal those of a run
without the fault (the failed draw had advanced the seeded generator and counted the
penalty rows' tokens)."""
from __future__ import annotations

from engine.request import SamplingParams
from tests.engine.fault_harness import assert_all_free, fail_once, prompt

PARAMS = {
    "seeded": SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True),
    "seeded_top_k": SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=11,
                                   logprobs=2, ignore_eos=True),
    "penalized": SamplingParams(max_tokens=12, temperature=0, frequency_penalty=1.5,
                                presence_penalty=0.5, ignore_eos=True),
    "greedy": SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
}


def run(make, monkeypatch=None, fail_at=3):
    h = make(max_num_seqs=len(PARAMS))
    for i, (rid, params) in enumerate(PARAMS.items()):
        h.submit(prompt(60 + i, 5 + i), params, rid)
    state = None
    for _ in range(fail_at):
        h.step()
    if monkeypatch is not None:
        state = fail_once(monkeypatch, h.engine.executor, "take_logprobs",
                          RuntimeError("boom after sampling"))
    out = {rid: h.finish(rid) for rid in PARAMS}
    assert state is None or state["fired"] == 1
    assert h.engine.stats.counters.errors == 0
    assert_all_free(h.engine)
    return out


def test_a_rerun_draws_as_if_the_failed_launch_never_drew(make, monkeypatch):
    want = run(make)
    got = run(make, monkeypatch)
    assert all(reason == "length" and len(tokens) == 12 for reason, tokens, _ in got.values())
    assert got == want


def test_every_tensor_parallel_rank_rewinds(monkeypatch):
    """Under TP every rank samples the step and feeds its own tokens to the next one: a
    launch failing on rank 0 after the workers drew has every rank rewind, so the rerun
    and the steps after it agree on every rank and equal one rank's run."""
    from engine import LLM
    prompts = [{"prompt_token_ids": prompt(60 + i, 5 + i)} for i in range(len(PARAMS))]
    params = list(PARAMS.values())
    knobs = dict(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=64,
                 block_size=4)
    with LLM(**knobs) as ref:
        want = [list(o.outputs[0].token_ids) for o in ref.generate(prompts, params)]
    with LLM(tensor_parallel_size=2, **knobs) as llm:
        calls = {"n": 0}
        state = fail_once(monkeypatch, llm.engine.executor, "take_logprobs",
                          RuntimeError("boom after sampling"),
                          when=lambda *a: calls.__setitem__("n", calls["n"] + 1) or calls["n"] == 4)
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        assert state["fired"] == 1 and llm.engine.stats.counters.errors == 0
    assert got == want

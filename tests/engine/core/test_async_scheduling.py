"""Async scheduling of every step (engine/core/core.py): step N+1 is planned and launched
while step N is in flight, the tokens N samples count as pending and reach N+1 on the
device. Greedy outputs equal the synchronous engine's through chunked prefills, prefix
hits, dedup, preemption and stop tokens; mixed steps really are chained."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.request import PENDING_TOKEN

KW = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=8,
          max_num_batched_tokens=96, max_num_seqs=12)


def _prompts(n=20, seed=3, vocab=512):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 200, (n,), generator=g).tolist()
    out = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens]
    shared = torch.randint(0, vocab, (40,), generator=g).tolist()
    out += [shared + [i] for i in range(4)] + [shared + [1]] * 2     # prefix hits, dedup
    return [{"prompt_token_ids": p} for p in out]


def _generate(llm, prompts, params):
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
            for o in llm.generate(prompts, params)]


def _chained_batches(llm):
    """Record (decodes fed from the device, prefill chunks) of every launched batch."""
    seen, runner = [], llm.engine.executor.runner
    real = runner.execute_model

    def execute_model(batch):
        rows = batch.prev_token_rows
        seen.append((0 if rows is None else int((rows >= 0).sum()), batch.num_prefills))
        return real(batch)
    runner.execute_model = execute_model
    return seen


@pytest.mark.parametrize("num_blocks", [400, 60])      # 60: preemptions
def test_async_outputs_equal_sync_and_mixed_steps_chain(num_blocks):
    prompts = _prompts()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = _generate(LLM(async_scheduling=False, num_blocks=num_blocks, **KW), prompts, params)
    llm = LLM(async_scheduling=True, num_blocks=num_blocks, **KW)
    seen = _chained_batches(llm)
    assert _generate(llm, prompts, params) == want
    assert any(fed and prefills for fed, prefills in seen), "no mixed step was chained"
    counters = llm.engine.stats.counters
    assert counters.prefix_hit_tokens > 0 and counters.dedup_joined > 0
    if num_blocks == 60:
        assert counters.preemptions > 0
    assert llm.engine.pool.num_used == 0
    assert llm.engine.executor._host_copies.allocations == 3     # its ring slots, reused every step


def test_stop_tokens_end_requests_without_the_extra_token():
    """A request its pending token stops is still in the next (launched) step: that
    step's token for it is computed and dropped, never emitted."""
    prompts = _prompts(n=12, seed=5)
    probe = _generate(LLM(async_scheduling=False, num_blocks=400, **KW), prompts,
                      SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    stop = sorted({t for toks, _ in probe for t in toks[2:6]})[:6]   # tokens that occur
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop_token_ids=stop)
    want = _generate(LLM(async_scheduling=False, num_blocks=400, **KW), prompts, params)
    got = _generate(LLM(async_scheduling=True, num_blocks=400, **KW), prompts, params)
    assert got == want
    assert sum(reason == "stop" for _, reason in got) >= 3


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_context_limit_ends_requests_by_length(async_scheduling):
    """max_tokens past max_model_len: a request ends with exactly max_model_len tokens
    (Request.length_cap takes the smaller of the two); async scheduling never plans a
    token past it."""
    llm = LLM(async_scheduling=async_scheduling, num_blocks=400, max_model_len=48, **KW)
    prompts = [{"prompt_token_ids": list(range(1, 1 + n))} for n in (1, 20, 47)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=500, temperature=0,
                                                ignore_eos=True))
    assert [(len(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs] == \
        [(47, "length"), (28, "length"), (1, "length")]
    short = llm.generate(prompts[:1], SamplingParams(max_tokens=5, temperature=0,
                                                     ignore_eos=True))
    assert len(short[0].outputs[0].token_ids) == 5       # max_tokens, when it is smaller
    assert llm.engine.pool.num_used == 0


def test_cancel_while_a_step_is_in_flight_frees_everything():
    llm = LLM(async_scheduling=True, num_blocks=400, **KW)
    eng = llm.engine
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    for p in _prompts(n=6, seed=7):
        llm.add_request(p, params)
    for _ in range(6):
        eng.step()
    assert eng._inflight is not None
    victim = next(iter(eng.requests.values()))
    n_before = len(victim.output_token_ids)
    eng.abort(victim.request_id)
    assert PENDING_TOKEN not in victim.output_token_ids and victim.num_pending == 0
    while eng.has_unfinished():
        out = eng.step()
        assert victim.request_id not in out.request_ids
    eng.flush()
    assert len(victim.output_token_ids) == n_before
    assert eng.pool.num_used == 0 and all(r.num_pending == 0 for r in eng.requests.values())


def test_a_failed_token_read_fails_the_chained_steps_and_nothing_hangs(monkeypatch):
    """Reading a step's tokens fails (the device died mid-run): the step, the one
    launched after it and every request whose token was still pending end with the
    error (dedup followers included); no placeholder stays behind, every block is
    freed, and the engine serves the next requests with the reference tokens."""
    prompts = _prompts(n=8, seed=13)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = _generate(LLM(async_scheduling=False, num_blocks=400, **KW), prompts, params)
    llm = LLM(async_scheduling=True, num_blocks=400, **KW)
    eng, calls = llm.engine, {"n": 0}
    real = eng._emit_tokens

    def emit(launched, out):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("device lost")
        return real(launched, out)
    monkeypatch.setattr(eng, "_emit_tokens", emit)
    got = [o for o in llm.generate(prompts, params)]
    errored = [o for o in got if o.outputs[0].finish_reason == "error"]
    assert errored and all("device lost" in o.error for o in errored)
    for o, (tokens, _) in zip(got, want):
        assert list(o.outputs[0].token_ids) == tokens[:len(o.outputs[0].token_ids)]
    assert eng.pool.num_used == 0 and not eng.requests and eng._inflight is None
    monkeypatch.setattr(eng, "_emit_tokens", real)
    assert _generate(llm, prompts, params) == want

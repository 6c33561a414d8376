"""CUDA graphs of mixed steps on the GPU (engine/worker/cuda_graphs.py): greedy tokens equal
to eager runs through chunked prefills, prefix hits and preemption, and mixed steps
replayed from graphs (not silently eager) in a steady state of arrivals; async
scheduling of mixed steps (planned while the previous step runs, its tokens fed on the
device) equal to synchronous steps."""
import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu


def _workload(vocab, n=32, seed=4):
    """Random prompts (some longer than the step budget: chunked) plus prompts that
    share a long prefix (prefix-cache hits)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 700, (n,), generator=g).tolist()
    out = [{"prompt_token_ids": torch.randint(0, vocab, (k,), generator=g).tolist()}
           for k in lens]
    shared = torch.randint(0, vocab, (160,), generator=g).tolist()
    out += [{"prompt_token_ids": shared + [i]} for i in range(6)]
    return out


def _run(llm, prompts, n=40):
    outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def _kw(**kw):
    # a pool of ~100 sequences' worth of 8k tokens, small enough to preempt under load
    return dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="bfloat16", num_blocks=640,
                max_num_batched_tokens=512, max_num_seqs=48, **kw)


def test_mixed_graphs_match_eager_bf16():
    """Same padded shapes with and without capture: bit-identical greedy tokens."""
    prompts = _workload(151936)
    eager = LLM(enforce_eager=True, **_kw())
    want = _run(eager, prompts)
    llm = LLM(**_kw())
    graphs = llm.engine.executor.runner.graphs
    assert graphs.use_graphs and any(k[0] == "mixed" for k in graphs.graphs)
    assert _run(llm, prompts) == want
    counters = llm.engine.stats.counters
    assert counters.preemptions > 0 and counters.prefix_hit_tokens > 0
    assert graphs.replays["mixed"] > 0 and graphs.replays["decode"] > 0


def test_mixed_graphs_match_eager_kernels_fp32():
    """Graph (unified attention, padded) vs full_decode_only (mixed steps eager through
    the extend + decode kernels, unpadded): fp32, so no near-tie flips the tokens."""
    prompts = _workload(512, n=24, seed=9)
    kw = dict(model="dummy:tiny", device="cuda", dtype="float32", num_blocks=400,
              block_size=8, max_num_batched_tokens=256, max_num_seqs=24)
    want = _run(LLM(cudagraph_mode="full_decode_only", **kw), prompts)
    llm = LLM(**kw)
    assert _run(llm, prompts) == want
    assert llm.engine.executor.runner.graphs.replays["mixed"] > 0


def test_mixed_steps_replay_graphs_in_steady_state(monkeypatch):
    """New requests arrive as others finish: every mixed step after start-up is a graph
    replay, none runs the eager forward."""
    llm = LLM(**_kw())
    eng, runner = llm.engine, llm.engine.executor.runner
    eager_calls = []
    real = runner._eager_forward
    monkeypatch.setattr(runner, "_eager_forward",
                        lambda batch, *a: eager_calls.append(batch.num_tokens) or real(batch, *a))
    prompts = _workload(151936, n=64, seed=6)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for p in prompts[:24]:
        llm.add_request(p, params)
    pending = list(prompts[24:])
    steps = 0
    while eng.has_unfinished() or pending:
        out = eng.step()
        steps += 1
        for _ in out.finished:
            if pending:
                llm.add_request(pending.pop(), params)
        if not eng.has_unfinished() and pending:
            llm.add_request(pending.pop(), params)
        assert steps < 5000
    torch.cuda.synchronize()
    graphs = runner.graphs
    assert graphs.replays["mixed"] >= 10, graphs.replays
    assert eager_calls == []


def test_async_mixed_steps_match_sync_fp32():
    """Every step chained (the next planned and launched before this one's tokens are
    read, pending tokens fed from the device into graph replays) vs synchronous steps:
    fp32, same greedy tokens; chained mixed steps did happen, through the graphs."""
    prompts = _workload(512, n=24, seed=11)
    kw = dict(model="dummy:tiny", device="cuda", dtype="float32", num_blocks=160,
              block_size=8, max_num_batched_tokens=256, max_num_seqs=24)
    want = _run(LLM(async_scheduling=False, **kw), prompts)
    llm = LLM(async_scheduling=True, **kw)
    runner, fed = llm.engine.executor.runner, []
    real = runner.execute_model
    runner.execute_model = lambda b: fed.append(
        b.prev_token_rows is not None and b.num_prefills > 0) or real(b)
    assert _run(llm, prompts) == want
    assert sum(fed) >= 5 and runner.graphs.replays["mixed"] > 0
    assert llm.engine.stats.counters.preemptions > 0


def test_greedy_decode_steps_take_the_graphs_argmax(monkeypatch):
    """All-greedy decode steps take their tokens from the argmax captured in the decode
    graph (the sampler hands that tensor back: no argmax launch after the graph); a
    sampling batch samples its own tokens, and greedy tokens equal an eager engine's."""
    llm = LLM(**_kw())
    runner = llm.engine.executor.runner
    graph_argmax = []       # per sampler call: whether its tokens are the graph's argmax
    real = runner.sampler.sample

    def spy(logits, cols, model_logits=None, argmax=None):
        tokens = real(logits, cols, model_logits, argmax)
        graph_argmax.append(argmax is not None and tokens is argmax)
        return tokens
    monkeypatch.setattr(runner.sampler, "sample", spy)
    prompts = _workload(151936, n=6, seed=8)
    got = _run(llm, prompts, n=24)
    assert all(len(t) == 24 for t in got)        # no step failed
    decode_replays = runner.graphs.replays["decode"]
    taken = sum(graph_argmax)
    assert decode_replays >= 20 and taken >= decode_replays - 2, (decode_replays, graph_argmax)
    eager = LLM(**_kw(enforce_eager=True))
    assert _run(eager, prompts, n=24) == got
    graph_argmax.clear()
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.8, seed=1))
    assert len(graph_argmax) >= 8 and not any(graph_argmax)   # each step samples its own

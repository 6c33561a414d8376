"""prompt_logprobs through the in-process LLM, chunked (a token budget of 128): a
request's output logprobs reappear as the prompt logprobs of a request whose prompt is
its prompt + output, and asking changes no request's tokens. On the CPU (dummy:tiny,
float32) and, marked gpu, with CUDA graphs on (float32, a Qwen2.5-0.5B-shaped model, vocab
151,936: the steps that carry prompt rows run eagerly, the others keep their graphs; in
bf16 the eager and padded graph shapes round differently, and the dummy weights' near-ties
flip tokens: measured on an H100 2026-11-25)."""
import pytest
import torch

from engine import LLM, SamplingParams

SETUPS = {
    "cpu": dict(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=512),
    "gpu": dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="float32", num_blocks=4096,
                enforce_eager=False),
}
VOCAB = {"cpu": 512, "gpu": 151936}
N, MAX_TOKENS = 16, 8


def _prompts(vocab: int, seed=3):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 400, (N,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens]


@pytest.mark.parametrize("setup", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_prompt_logprobs_continue_output_logprobs(setup):
    llm = LLM(max_num_batched_tokens=128, enable_prefix_caching=False, **SETUPS[setup])
    if setup == "gpu":
        assert llm.engine.executor.runner.graphs.use_graphs
    prompts = _prompts(VOCAB[setup])
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)
    asked = [greedy.replace(prompt_logprobs=3) if i % 2 else greedy for i in range(N)]
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], asked)
    for i, (a, b) in enumerate(zip(first, again)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert (b.prompt_logprobs is not None) == bool(i % 2)
        if i % 2:
            assert len(b.prompt_logprobs) == len(prompts[i]) and b.prompt_logprobs[0] is None
            assert [e.token_ids[0] for e in b.prompt_logprobs[1:]] == prompts[i][1:]
    # prompt + output as a prompt: its last MAX_TOKENS positions' logprobs are the output's
    ext = [{"prompt_token_ids": p + list(o.outputs[0].token_ids)} for p, o in zip(prompts, first)]
    lps = llm.generate(ext, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3))
    for p, o, e in zip(prompts, first, lps):
        tail = e.prompt_logprobs[len(p):]
        out = o.outputs[0].logprobs
        assert [t.token_ids[0] for t in tail] == list(o.outputs[0].token_ids)
        assert [t.logprobs[0] for t in tail] == pytest.approx([t.logprobs[0] for t in out],
                                                              abs=0.1)
        assert sum(t.rank == 1 for t in tail) >= MAX_TOKENS - 2     # greedy: mostly top


def test_prompt_logprobs_survive_preemption_and_chunks():
    """A pool too small for the batch (preemption, recompute) and chunks of 32 tokens:
    every request's prompt logprobs and tokens equal a run with room for everything."""
    base = "ROMEO.\nWhat news from the court? " * 4
    prompts = [base + tail for tail in ("Speak!", "Say on.", "O, tell me.", "Well?")] * 2
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, prompt_logprobs=2)
    ref = LLM(device="cpu", num_blocks=256).generate(prompts, params)
    tight = LLM(device="cpu", num_blocks=14, max_num_batched_tokens=32)
    got = tight.generate(prompts, params)
    assert tight.engine.stats.counters.preemptions > 0
    # (a request preempted after its prompt logprobs went out may take prefix hits)
    for r, g in zip(ref, got):
        assert g.outputs[0].token_ids == r.outputs[0].token_ids
        assert g.prompt_logprobs[0] is None and len(g.prompt_logprobs) == len(r.prompt_logprobs)
        for a, b in zip(g.prompt_logprobs[1:], r.prompt_logprobs[1:]):
            assert a.token_ids == b.token_ids and a.rank == b.rank
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_dedup_follower_beside_prompt_logprob_rows_samples_its_leaders_row():
    """A step whose prefill completes a prompt with a dedup follower (2 sample rows: the
    leader's row twice) and one prompt-logprob row (2 logits rows): the counts match, yet
    the follower must sample its leader's row, not the prompt row (it took that one)."""
    a = {"prompt_token_ids": list(range(40, 55))}   # 15 tokens: chunks of 8 + 7, then
    b = {"prompt_token_ids": list(range(90, 101))}  # 1 token of b beside the 7
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    want = LLM(model="dummy:tiny", device="cpu").generate(a, greedy)[0].outputs[0].token_ids
    llm = LLM(model="dummy:tiny", device="cpu", max_num_batched_tokens=8)
    out = llm.generate([a, a, b], [greedy, greedy, greedy.replace(prompt_logprobs=0)])
    assert llm.engine.stats.counters.dedup_joined > 0
    assert [o.outputs[0].token_ids for o in out[:2]] == [want, want]
    assert len(out[2].prompt_logprobs) == len(b["prompt_token_ids"])

"""The batched sampling path on the GPU with CUDA graphs on (bf16, a Qwen2.5-0.5B-shaped
model, vocab 151,936): plain greedy rows keep the graphs' own argmax tokens beside rows
with penalties, bias, min_p, min_tokens and logprobs; those rows give the same tokens
and logprobs with graphs as eagerly. A batch whose rows only ask logprobs (the TUI's
workload) takes the graphs' argmax and reads only the asking rows."""
import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

# no prefix cache: every run starts cold, so one request's prompt is computed the same way
# in each run (a warm run computes only the uncached tail, and in bf16 that alone can flip
# a near-tie some tokens later)
KW = dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="bfloat16", num_blocks=4096,
          max_num_batched_tokens=2048, enable_prefix_caching=False)
N = 64
MAX_TOKENS = 24


def _prompts(vocab=151936, seed=5):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(4, 200, (N,), generator=g).tolist()
    return [{"prompt_token_ids": torch.randint(0, vocab, (k,), generator=g).tolist()}
            for k in lens]


def _params(i: int) -> SamplingParams:
    """Four kinds of rows, interleaved."""
    base = dict(max_tokens=MAX_TOKENS, ignore_eos=True)
    kind = i % 4
    if kind == 0:
        return SamplingParams(temperature=0, **base)
    if kind == 1:
        return SamplingParams(temperature=0, logprobs=5, **base)
    if kind == 2:
        return SamplingParams(temperature=0, frequency_penalty=1.0, presence_penalty=0.5,
                              repetition_penalty=1.2, logit_bias={11: 5.0}, **base)
    return SamplingParams(temperature=0.8, seed=i, min_p=0.05, min_tokens=4,
                          frequency_penalty=0.5, logprobs=2, **base)


def _run(llm, prompts, params):
    return [o.outputs[0] for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def runs():
    prompts = _prompts()
    params = [_params(i) for i in range(N)]
    graphs = LLM(enforce_eager=False, **KW)
    assert graphs.engine.executor.runner.graphs.use_graphs
    plain = _run(graphs, prompts, [SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                  ignore_eos=True)] * N)
    mixed = _run(graphs, prompts, params)
    only_lp = _run(graphs, prompts, [_logprobs_only(i) for i in range(N)])
    del graphs
    eager = _run(LLM(enforce_eager=True, **KW), prompts, params)
    return plain, mixed, eager, only_lp


def _logprobs_only(i: int) -> SamplingParams:
    return SamplingParams(temperature=0, logprobs=5 if i % 4 == 1 else None,
                          max_tokens=MAX_TOKENS, ignore_eos=True)


def test_plain_greedy_rows_unchanged(runs):
    plain, mixed, _, _ = runs
    for i in range(0, N, 4):
        assert mixed[i].token_ids == plain[i].token_ids and mixed[i].logprobs is None
    for i in range(1, N, 4):         # logprobs asked: still the argmax, rank 1
        assert mixed[i].token_ids == plain[i].token_ids
        # rank 1, and the top entry's logprob is the sampled one's (a bf16 tie may list
        # another id of equal value first)
        assert all(lp.rank == 1 and lp.logprobs[0] == lp.logprobs[1] for lp in mixed[i].logprobs)


def test_processed_rows_match_eager(runs):
    plain, mixed, eager, _ = runs
    for i in range(N):
        assert mixed[i].token_ids == eager[i].token_ids, i
        if mixed[i].logprobs is not None:
            got = [v for lp in mixed[i].logprobs for v in lp.logprobs]
            want = [v for lp in eager[i].logprobs for v in lp.logprobs]
            assert got == pytest.approx(want, abs=2e-2)
    changed = [mixed[i].token_ids != plain[i].token_ids for i in range(2, N, 4)]
    assert sum(changed) >= len(changed) // 2        # the penalties and bias act


def test_logprobs_only_batch_keeps_the_argmax(runs):
    """Greedy rows, a quarter asking logprobs: every row's tokens are the plain run's,
    and the asking rows' logprobs are those the processed path gave them in the mixed
    run (its batch differs, so within bf16 rounding)."""
    plain, mixed, _, only_lp = runs
    for i in range(N):
        assert only_lp[i].token_ids == plain[i].token_ids, i
        if i % 4 != 1:
            assert only_lp[i].logprobs is None
            continue
        assert [lp.token_ids[0] for lp in only_lp[i].logprobs] == list(only_lp[i].token_ids)
        got = [v for lp in only_lp[i].logprobs for v in lp.logprobs]
        want = [v for lp in mixed[i].logprobs for v in lp.logprobs]
        assert got == pytest.approx(want, abs=2e-2)

"""Speculative decoding on the GPU with CUDA graphs on (docs/SPECULATIVE.md): greedy
tokens with speculation equal those without, n-gram drafts on repeated token patterns and
the benchmark oracle (every draft right: everything accepted). Verified positions are
decode rows: decode-only verify steps replay the verify graphs (decode buckets, the
in-graph argmax), verify rows beside prefill chunks the mixed graphs. float32, so that
no near-tie flips a token where the same position is computed in differently shaped
batches (bf16 runs may differ there, as in vLLM)."""

import pytest
import torch

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

KW = dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="float32", num_blocks=2048,
          max_num_batched_tokens=1024, max_num_seqs=32)
GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


def _prompts(n=24, seed=3):
    """Random prompts made of a repeated pattern (n-gram drafts find matches)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        pattern = torch.randint(0, 151936, (int(torch.randint(3, 9, (1,), generator=g)),),
                                generator=g).tolist()
        out.append(pattern * (4 + i % 5))
    return out


def _run(llm, prompts):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def reference():
    prompts = _prompts()
    with LLM(**KW) as llm:
        return prompts, _run(llm, prompts)


def test_ngram_speculation_keeps_greedy_tokens_with_graphs(reference):
    prompts, want = reference
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    with LLM(speculative_config=spec, **KW) as llm:
        assert llm.engine.executor.runner.graphs.use_graphs
        got = _run(llm, prompts)
        c = llm.engine.counters
        replays = dict(llm.engine.executor.runner.graphs.replays)
    assert got == want
    assert c.spec_decode_num_draft_tokens > 0 and replays["verify"] > 0 and replays["mixed"] > 0


def test_oracle_drafts_all_accepted_with_graphs(reference):
    prompts, want = reference
    oracle = OracleProposer(zip(prompts, want), 1.0)
    with LLM(num_speculative_tokens=4, proposer=oracle, **KW) as llm:
        graphs = llm.engine.executor.runner.graphs
        assert graphs.verify_buckets[-1] >= KW["max_num_seqs"] * 5   # every verify step fits
        got = _run(llm, prompts)
        c = llm.engine.counters
        replays = dict(graphs.replays)
    assert got == want
    assert c.spec_decode_num_draft_tokens > 0 and replays["verify"] > 0
    assert c.spec_decode_num_accepted_tokens == c.spec_decode_num_draft_tokens

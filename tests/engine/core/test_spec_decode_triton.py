"""Speculative decoding's verify steps on the Triton kernels, end to end on the CPU (the
interpreter): the model's decode-only steps with verify rows pass rows_shared to the one
fused rotary + store + attention launch (engine/worker/models/llama.py), whose rows of
one request take each other's new K/V from registers (docs/KERNELS.md "Verify rows in
the fused launch")."""
import os

import pytest
import torch

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams


def test_verify_steps_on_the_triton_kernels_match_the_torch_engine():
    """The engine on the Triton kernels (the interpreter, CPU suite) with oracle drafts
    proposing the torch engine's own tokens: every verify step's attention is the one
    fused launch with rows_shared, run longest context first (so a request's later rows
    go before its earlier ones), and every draft is accepted with the same tokens. With
    rows_shared off the later rows read their earlier rows' K/V before its store (few drafts
    accepted, the tokens differ)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton interpreter runs in the CPU suite (the GPU has "
                    "test_spec_decode_gpu.py)")
    g = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(0, 64, (n,), generator=g).tolist()}
               for n in (5, 17)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    kw = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=4,
              num_blocks=64, max_num_batched_tokens=64, max_num_seqs=4)
    with LLM(attention_backend="torch", **kw) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    oracle = OracleProposer(p=1.0)
    oracle.set_references([(p["prompt_token_ids"], w) for p, w in zip(prompts, want)])
    with LLM(attention_backend="triton", num_speculative_tokens=3, proposer=oracle,
             **kw) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        c = llm.engine.counters
    assert got == want
    assert c.spec_decode_num_draft_tokens > 0
    assert c.spec_decode_num_accepted_tokens == c.spec_decode_num_draft_tokens

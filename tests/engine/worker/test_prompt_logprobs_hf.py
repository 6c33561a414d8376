"""prompt_logprobs on the bundled model through the engine in its own process
(EngineClient, the default path), against HF transformers' log-softmax over the same
prompt: every position's logprob, rank and top-n, through chunked prefill (a token
budget of 8 splits the prompt into chunks), beside other requests, and with the prefix
cache warm (a request that asks skips the hit and computes every position)."""
from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.front.client import EngineClient
from roseplay.bench.hf_compare import build_hf_model

PROMPT = "ROMEO.\nWhat news from the court? Speak, good Balthasar, what news?\n"
TIMEOUT = 60
BUDGET = 8       # max_num_batched_tokens: the prompt takes several prefill chunks


@pytest.fixture(scope="module")
def client():
    c = EngineClient(device="cpu", num_blocks=256, label="test", max_num_batched_tokens=BUDGET)
    yield c
    c.close()
    assert c.proc.poll() is not None


@pytest.fixture(scope="module")
def hf_ref(client):
    """(prompt ids, HF log-softmax [n, V] of every prompt position) in float32."""
    ids = list(client.submit(PROMPT, SamplingParams(max_tokens=1)).result(TIMEOUT)
               .prompt_token_ids)
    hf = build_hf_model("default", torch.float32)
    with torch.no_grad():
        return ids, torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def check_against_hf(prompt_logprobs, ids, ref, n: int) -> None:
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for q in range(1, len(ids)):
        lp, row = prompt_logprobs[q], ref[q - 1]        # row q-1 predicts token q
        top = row.topk(n)
        assert lp.token_ids[0] == ids[q]
        assert lp.logprobs[0] == pytest.approx(float(row[ids[q]]), abs=2e-3)
        assert lp.rank == int((row > row[ids[q]]).sum()) + 1
        assert lp.token_ids[1:] == top.indices.tolist()
        assert lp.logprobs[1:] == pytest.approx(top.values.tolist(), abs=2e-3)


def test_prompt_logprobs_equal_hf_through_chunks(client, hf_ref):
    ids, ref = hf_ref
    assert len(ids) > 3 * BUDGET
    plain = client.submit(PROMPT, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    asked = client.submit(PROMPT, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                 prompt_logprobs=4))
    plain, asked = plain.result(TIMEOUT), asked.result(TIMEOUT)
    check_against_hf(asked.prompt_logprobs, ids, ref, 4)
    assert plain.prompt_logprobs is None
    assert asked.outputs[0].token_ids == plain.outputs[0].token_ids   # sampling unchanged
    assert asked.metrics.num_cached_tokens == 0


def test_prefix_cache_hit_skipped_for_prompt_logprobs(client, hf_ref):
    """The prompt's blocks are cached by now: a plain request hits them, one that asks
    for prompt logprobs does not (its positions need logits) and still equals HF."""
    ids, ref = hf_ref
    warm = client.submit(PROMPT, SamplingParams(max_tokens=1)).result(TIMEOUT)
    assert warm.metrics.num_cached_tokens > 0
    asked = client.submit(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=0)).result(TIMEOUT)
    assert asked.metrics.num_cached_tokens == 0
    check_against_hf(asked.prompt_logprobs, ids, ref, 0)


def test_streamed_once_and_one_token_prompt(client, hf_ref):
    """A stream carries the prompt's logprobs on one event (with the first token); a
    one-token prompt has only the leading None."""
    ids, _ = hf_ref
    events = list(client.submit(PROMPT, SamplingParams(max_tokens=3, prompt_logprobs=1,
                                                       ignore_eos=True)))
    carrying = [e for e in events if e.prompt_logprobs is not None]
    assert len(carrying) == 1 and carrying[0].token_ids and len(carrying[0].prompt_logprobs) == len(ids)
    one = client.submit([ids[0]], SamplingParams(max_tokens=1, prompt_logprobs=2)).result(TIMEOUT)
    assert one.prompt_logprobs == (None,)

"""Logprobs and penalties on the bundled model through the engine in its own process
(EngineClient, the default path), checked against HF transformers running the same
weights: logprobs equal HF's log-softmax, penalised greedy tokens equal a reference
applied to HF's logits, min_tokens holds a stop token back, and plain greedy requests
keep their tokens whatever else is in the batch."""
from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.front.client import EngineClient
from roseplay.bench.hf_compare import build_hf_model
from engine.request import Request
from tests.engine.worker.sampling_ref import ref_processed

PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
TIMEOUT = 60


@pytest.fixture(scope="module")
def client():
    c = EngineClient(device="cpu", num_blocks=256, label="test")
    yield c
    c.close()
    assert c.proc.poll() is not None


@pytest.fixture(scope="module")
def hf():
    return build_hf_model("default", torch.float32)


@pytest.fixture(scope="module")
def prompt_ids(client):
    return list(client.submit(PROMPT, SamplingParams(max_tokens=1)).result(TIMEOUT).prompt_token_ids)


def run(client, params: SamplingParams, prompt=PROMPT):
    return client.submit(prompt, params).result(TIMEOUT).outputs[0]


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


def test_logprobs_equal_hf_log_softmax(client, hf, prompt_ids):
    """Greedy (no processing: processed = raw) and a seeded temperature-0.8 request (the
    distribution sampled from: log_softmax(logits / 0.8)): the sampled token's logprob,
    its rank and the top 5 equal HF's within float32 tolerance."""
    for temp in (0.0, 0.8):
        out = run(client, SamplingParams(max_tokens=6, temperature=temp, seed=7,
                                         ignore_eos=True, logprobs=5))
        assert len(out.logprobs) == len(out.token_ids) == 6
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            ref = torch.log_softmax(hf_logits(hf, prompt_ids + list(out.token_ids[:i]))
                                    / (temp or 1.0), -1)
            top = ref.topk(5)
            assert lp.token_ids[0] == token
            assert lp.logprobs[0] == pytest.approx(float(ref[token]), abs=2e-3)
            assert lp.rank == int((ref > ref[token]).sum()) + 1
            assert lp.token_ids[1:] == top.indices.tolist()
            assert lp.logprobs[1:] == pytest.approx(top.values.tolist(), abs=2e-3)
            if temp == 0.0:
                assert lp.rank == 1
        assert out.cumulative_logprob == pytest.approx(sum(lp.logprobs[0] for lp in out.logprobs))


def test_penalties_and_bias_change_greedy_tokens_as_defined(client, hf, prompt_ids):
    """Each token equals the argmax of HF's logits after the definitions (tests/
    test_sampling_extras.py ref_processed) over the prompt and the output so far."""
    plain = run(client, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    bias_token = plain.token_ids[1]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, presence_penalty=0.5,
                            frequency_penalty=1.0, repetition_penalty=1.3,
                            logit_bias={bias_token: -5.0})
    out = run(client, params)
    ref = Request("ref", list(prompt_ids), params)
    for _ in range(12):
        logits = hf_logits(hf, prompt_ids + ref.output_token_ids)
        ref.output_token_ids.append(int(ref_processed(logits, ref).argmax()))
    assert list(out.token_ids) == ref.output_token_ids
    assert out.token_ids != plain.token_ids and bias_token not in out.token_ids


def test_min_tokens_holds_back_stop_tokens(client):
    first = run(client, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)).token_ids[0]
    stopped = run(client, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[first]))
    assert stopped.token_ids == (first,) and stopped.finish_reason == "stop"
    held = run(client, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[first],
                                      min_tokens=5))
    assert len(held.token_ids) >= 5 and first not in held.token_ids[:5]
    # stop strings too (vLLM): not matched until the output is longer than min_tokens
    text = run(client, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)).text
    cut = run(client, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                     stop=text[:2]))
    assert cut.text == "" and cut.finish_reason == "stop" and len(cut.token_ids) <= 2
    late = run(client, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                      stop=text[:2], min_tokens=4))
    assert len(late.token_ids) >= 4 and late.text.startswith(text[:2])


def test_plain_greedy_unchanged_beside_processed_requests(client):
    """A greedy request's tokens alone = in a batch with penalty, bias, min_p, logprobs
    and random requests = with logprobs asked itself."""
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    alone = run(client, greedy).token_ids
    others = [SamplingParams(max_tokens=10, temperature=0, frequency_penalty=2.0, logprobs=3),
              SamplingParams(max_tokens=10, temperature=0.9, seed=1, min_p=0.1,
                             logit_bias={5: 4.0}, repetition_penalty=1.5),
              SamplingParams(max_tokens=10, temperature=0.7, min_tokens=3, logprobs=0)]
    streams = [client.submit(PROMPT, greedy)] + [client.submit(PROMPT, p) for p in others] + \
        [client.submit(PROMPT, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                                              logprobs=2))]
    outs = [s.result(TIMEOUT).outputs[0] for s in streams]
    assert outs[0].token_ids == alone and outs[0].logprobs is None
    assert outs[-1].token_ids == alone and len(outs[-1].logprobs) == len(alone)
    assert all(lp.rank == 1 for lp in outs[-1].logprobs)

"""The sampler's vLLM processing (penalties, logit bias, min_p, min_tokens, logprobs) on
synthetic logits, each checked against a plain torch reference of its definition, with
the step columns built from real Requests by the batch builder (no model: fast)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine.core.batch_builder import _sampling_columns
from engine.request import Request, SamplingParams
from engine.worker.logprobs import unpack_tensor
from engine.worker.sampling import Sampler
from tests.engine.worker.sampling_ref import NEG_INF, ref_processed

V = 12


def req(rid: str, prompt=(1, 2, 3), output=(), stop_ids=(), **params) -> Request:
    r = Request(rid, list(prompt), SamplingParams(max_tokens=64, **params))
    r.output_token_ids = list(output)
    r.stop_ids = frozenset(stop_ids)
    return r


def sample(sampler, logits, requests):
    return sampler.sample(logits, _sampling_columns(requests)).tolist()


def test_penalties_follow_their_definition_over_steps():
    """Counts live on the device: five steps, tokens appended on the host only for the
    reference; greedy rows with penalties pick the reference's argmax every step, and a
    plain greedy row in the same batch keeps the raw argmax."""
    torch.manual_seed(0)
    rows = [req("plain", temperature=0),
            req("freq", temperature=0, frequency_penalty=1.5, presence_penalty=0.3),
            req("rep", prompt=(4, 5, 6, 7), temperature=0, repetition_penalty=1.8),
            req("all", temperature=0, frequency_penalty=-0.5, presence_penalty=2.0,
                repetition_penalty=1.3, logit_bias={7: 2.5, 0: -1.0})]
    sampler = Sampler(torch.device("cpu"))
    changed = 0
    for _ in range(5):
        logits = torch.randn(len(rows), V) * 2
        tokens = sample(sampler, logits, rows)
        assert tokens[0] == int(logits[0].argmax())
        for i, r in enumerate(rows[1:], 1):
            assert tokens[i] == int(ref_processed(logits[i], r).argmax()), r.request_id
            changed += tokens[i] != int(logits[i].argmax())
        for r, t in zip(rows, tokens):
            r.output_token_ids.append(t)
    assert changed >= 3       # the penalties did change tokens (else this tests nothing)
    freq = rows[1].output_token_ids
    assert len(set(freq)) > 1


def test_released_slot_is_reset_for_the_next_request():
    sampler = Sampler(torch.device("cpu"))
    a = req("a", temperature=0, frequency_penalty=2.0)
    logits = torch.zeros(1, V)
    logits[0, 3] = 1.0
    for _ in range(3):
        a.output_token_ids.append(sample(sampler, logits, [a])[0])
    assert a.output_token_ids[0] == 3 and a.output_token_ids[1] != 3
    sampler.release("a")
    b = req("b", temperature=0, frequency_penalty=2.0)     # takes a's slot
    assert sample(sampler, logits, [b]) == [3]
    assert sampler.counts.slots == {"b": 0}


def test_min_tokens_masks_stop_tokens_until_reached():
    logits = torch.zeros(1, V)
    logits[0, 9] = 5.0                      # the stop token is the best by far
    r = req("m", temperature=0, min_tokens=2, stop_ids=(9, 10))
    sampler = Sampler(torch.device("cpu"))
    got = []
    for _ in range(3):
        t = sample(sampler, logits, [r])[0]
        got.append(t)
        r.output_token_ids.append(t)
    assert got[0] not in (9, 10) and got[1] not in (9, 10) and got[2] == 9


def test_processed_logprobs_are_the_distribution_sampled_from():
    """Temperature, bias, penalties, min_p and top-k together: the logprobs of every
    token (logprobs=V: the whole row) are the reference's log-softmax, -inf where min_p
    or top-k removed a token, and seeded draws never land there."""
    torch.manual_seed(1)
    logits = torch.randn(2, V) * 3
    params = dict(temperature=0.7, min_p=0.05, top_k=6, logit_bias={2: 1.5},
                  presence_penalty=0.5, repetition_penalty=1.2, logprobs=V, seed=5)
    rows = [req("r", output=(2, 4), **params), req("g", temperature=0, logprobs=3)]
    sampler = Sampler(torch.device("cpu"))
    sampler.counts.slots_of(["r"], V)
    sampler.counts.add(torch.tensor([0, 0]), torch.tensor([2, 4]))   # its two outputs
    rows[0].output_token_ids = [2, 4]
    cols = _sampling_columns(rows)
    assert not cols.extras.first_sample[0]
    tokens = sampler.sample(logits, cols).tolist()
    ids, values, ranks = unpack_tensor(sampler.last_logprobs[0])
    want = torch.log_softmax(ref_processed(logits[0], rows[0]), -1)
    got = torch.full((V,), NEG_INF)
    got[ids[0, 1:]] = values[0, 1:]
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.allclose(got[~got.isinf()], want[~want.isinf()], atol=1e-5)
    assert want.isinf().sum() >= V - 6 and want[tokens[0]] > NEG_INF
    assert ids[0, 0] == tokens[0] and values[0, 0] == pytest.approx(float(want[tokens[0]]))
    # the greedy row: sampled = the top-1, rank 1, logprob = log_softmax of its logits
    g = torch.log_softmax(logits[1], -1)
    assert ids[1, 0] == ids[1, 1] == int(g.argmax()) and ranks[1] == 1
    assert values[1, :4].tolist() == pytest.approx([float(g.max())] + g.topk(3).values.tolist())


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logits"])
def test_logprobs_modes(mode):
    torch.manual_seed(2)
    logits = torch.randn(1, V)
    r = req("x", temperature=0, logit_bias={5: 50.0}, logprobs=2)
    sampler = Sampler(torch.device("cpu"), logprobs_mode=mode)
    token = sample(sampler, logits, [r])[0]
    assert token == 5
    ids, values, _ = unpack_tensor(sampler.last_logprobs[0])
    source = logits[0] if mode.startswith("raw") else ref_processed(logits[0], r)
    if mode.endswith("logprobs"):
        source = torch.log_softmax(source, -1)
    assert values[0].tolist() == pytest.approx([float(source[5])] + source.topk(2).values.tolist())


def test_min_p_draws_stay_above_the_floor():
    """Many seeded draws of a min_p row: only tokens whose probability is at least
    min_p x the top one are ever drawn; each such token is drawn."""
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.09, 0.06] + [0.0] * (V - 5)]) + 1e-12)
    sampler = Sampler(torch.device("cpu"), seed=3)
    seen = Counter()
    for i in range(300):
        r = req(f"s{i}", temperature=1.0, min_p=0.25)
        seen[sample(sampler, logits, [r])[0]] += 1
    assert set(seen) == {0, 1, 2}             # 0.09 and 0.06 < 0.25 x 0.5
    assert seen[0] > seen[1] > 0 and seen[2] > 0


def test_plain_rows_keep_the_fast_columns():
    rows = [req("a", temperature=0), req("b", temperature=0)]
    assert _sampling_columns(rows).extras is None
    rows.append(req("c", temperature=0, logprobs=0))
    cols = _sampling_columns(rows)
    assert cols.all_greedy and cols.extras.logprob_rows.tolist() == [2]
    logits = torch.randn(3, V)
    sampler = Sampler(torch.device("cpu"))
    assert sampler.sample(logits, cols).tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs", "processed_logits"])
def test_logprobs_only_steps_match_the_processed_path(mode):
    """A step whose rows only ask logprobs samples on the plain path and reads only the
    rows that asked: the same tokens and logprobs as the processed path, which a zero
    logit bias on one row forces (it changes no logit), with greedy, random, seeded and
    top-k / top-p rows in one batch and the raw view on one of them."""
    torch.manual_seed(3)
    logits = (torch.randn(6, V) * 2).to(torch.bfloat16)
    rows = [req("g", temperature=0, logprobs=3),
            req("p", temperature=0),
            req("t", temperature=0.8, top_k=5, logprobs=V),
            req("s", temperature=1.1, top_p=0.7, seed=11, logprobs=2),
            req("r", temperature=0.9),
            req("w", temperature=0, logprobs=1, raw_logprobs=True)]
    biased = rows[:1] + [req("p", temperature=0, logit_bias={0: 0.0})] + rows[2:]
    fast_cols, slow_cols = _sampling_columns(rows), _sampling_columns(biased)
    assert fast_cols.extras.only_logprobs and not slow_cols.extras.only_logprobs
    got = []
    for cols in (fast_cols, slow_cols):
        sampler = Sampler(torch.device("cpu"), seed=7, logprobs_mode=mode)
        tokens = sampler.sample(logits, cols).tolist()
        got.append((tokens, [t.tolist() for p in sampler.last_logprobs for t in unpack_tensor(p)]))
    assert got[0] == got[1]
    assert len(got[0][1]) == 6        # the raw view's three unpacked tensors follow


def test_greedy_logprobs_rows_share_the_greedy_columns():
    """Greedy rows that only ask logprobs keep the shared greedy columns (no per-row pass
    over the step), the graph's argmax is taken as the tokens, and the logprobs are read
    from the asking rows only."""
    rows = [req("a", temperature=0), req("b", temperature=0, logprobs=2),
            req("c", temperature=0)]
    cols = _sampling_columns(rows)
    assert cols.all_greedy and cols.request_ids == () and cols.extras.only_logprobs
    assert cols.extras.logprob_rows.tolist() == [1] and cols.extras.penalty_rows.size == 0
    logits = torch.randn(3, V)
    argmax = logits.argmax(-1)
    sampler = Sampler(torch.device("cpu"))
    assert sampler.sample(logits, cols, argmax=argmax) is argmax
    ids, values, ranks = unpack_tensor(sampler.last_logprobs[0])
    lp = torch.log_softmax(logits[1], -1)
    assert ids.tolist() == [[int(argmax[1])] + lp.topk(2).indices.tolist()]
    assert ranks.tolist() == [1] and values[0, 0] == pytest.approx(float(lp.max()))


def test_a_row_without_top_p_keeps_its_tail_beside_a_row_with_one():
    """top_p=1 keeps every token whatever the batch: beside a row with top_p < 1 the cut
    runs over every row, and a tail whose mass above it rounds to 1.0 in float32 was
    dropped from the row that asked for none (its logprobs -inf, its draws changed)."""
    logits = torch.zeros(2, V)
    logits[:, 0] = 30.0                  # the rest of the row: e^-30 each, above it ~1.0
    alone = Sampler(torch.device("cpu"))
    r = req("r", temperature=1.0, seed=3, logprobs=V)
    alone.sample(logits[:1], _sampling_columns([r]))
    beside = Sampler(torch.device("cpu"))
    beside.sample(logits, _sampling_columns([r, req("p", temperature=1.0, top_p=0.5)]))
    ids, values, _ = unpack_tensor(alone.last_logprobs[0])
    ids2, values2, _ = unpack_tensor(beside.last_logprobs[0])
    assert values[0].isinf().sum() == 0                 # alone: every token has its logprob
    assert ids2[0].tolist() == ids[0].tolist() and torch.equal(values2[0], values[0])

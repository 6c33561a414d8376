"""The vectorised host side of a verify step (docs/SPECULATIVE.md "Host cost"): the
accepted counts of all chunks from one numpy comparison equal the per-chunk definition
(the longest prefix of drafts equal to the target's tokens), with the counters and the
per-position counts; the verify rows' draft ids; the oracle's one draw per step."""
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.oracle import OracleProposer
from engine.core.batch_builder import _verify_columns
from engine.core.ngram_proposer import NgramProposer
from engine.core.step_plan import VerifyChunk
from engine.core.spec_decode import SpecDecoder


class _Req:
    def __init__(self, rid: str, prompt: list[int], output: list[int], table_row: int = 0):
        self.request_id, self.table_row = rid, table_row
        self.prompt_token_ids, self.output_token_ids = list(prompt), list(output)

    def token_slice(self, start: int, end: int) -> list[int]:
        return (self.prompt_token_ids + self.output_token_ids)[start:end]


def _counters():
    return SimpleNamespace(spec_decode_num_drafts=0, spec_decode_num_draft_tokens=0,
                           spec_decode_num_accepted_tokens=0)


def test_accepted_counts_equal_the_per_chunk_definition():
    rng = np.random.default_rng(0)
    spec = SpecDecoder(NgramProposer(1, 4), SimpleNamespace(kv=None), _counters())
    want_pos, want_tokens, want_accepted, drafts_seen = [0] * 5, 0, 0, 0
    for step in range(200):
        chunks, tokens, want = [], [], []
        for i in range(int(rng.integers(1, 12))):
            draft = rng.integers(0, 3, int(rng.integers(1, 6))).tolist()   # near-ties
            row = rng.integers(0, 3, len(draft) + 1).tolist()
            chunks.append(VerifyChunk(_Req(f"r{i}", [1], [2]), 1, draft))
            tokens += row
            a = 0
            while a < len(draft) and row[a] == draft[a]:
                want_pos[a] += 1
                a += 1
            want.append(a)
            want_tokens += len(draft)
        spec._count_accepted(chunks, tokens)
        assert [c.accepted for c in chunks] == want, step
        want_accepted += sum(want)
        drafts_seen += len(chunks)
    c = spec.counters
    assert (c.spec_decode_num_drafts, c.spec_decode_num_draft_tokens,
            c.spec_decode_num_accepted_tokens) == (drafts_seen, want_tokens, want_accepted)
    assert spec.per_position() == tuple(want_pos)


def test_verify_rows_check_the_next_rows_input():
    """Row j of a chunk checks the draft fed as row j + 1; the chunk's last row none."""
    reqs = [_Req("a", [5, 6], [7], table_row=3), _Req("b", [8], [9, 10], table_row=1)]
    chunks = [VerifyChunk(reqs[0], 2, [11, 12, 13]), VerifyChunk(reqs[1], 2, [14])]
    got_reqs, rows, positions, ids, drafts = _verify_columns(chunks)
    assert got_reqs == [reqs[0]] * 4 + [reqs[1]] * 2
    assert rows.tolist() == [3, 3, 3, 3, 1, 1]
    assert positions.tolist() == [2, 3, 4, 5, 2, 3]
    assert ids == [7, 11, 12, 13, 10, 14]
    assert drafts.tolist() == [11, 12, 13, -1, 14, -1]
    got_reqs, rows, positions, ids, drafts = _verify_columns(chunks[1:])   # a lone request
    assert (got_reqs, rows.tolist(), positions.tolist(), ids, drafts.tolist()) == \
        ([reqs[1]] * 2, [1, 1], [2, 3], [10, 14], [14, -1])


@pytest.mark.parametrize("p", [1.0, 0.0, 0.5])
def test_oracle_keeps_each_draft_with_probability_p(p):
    ref = list(range(0, 300))
    oracle = OracleProposer([([1, 2, 3], ref)], p, seed=1)
    reqs = [_Req(f"r{i}", [1, 2, 3], ref[:i]) for i in range(200)]
    rooms = [1 + i % 5 for i in range(200)]
    drafts = oracle.propose(reqs, rooms)
    kept = total = 0
    for i, (room, draft) in enumerate(zip(rooms, drafts)):
        want = ref[i:i + room]
        assert len(draft) == len(want)
        for t, w in zip(draft, want):
            assert t == w or t == (w - 1 if w > 0 else 1)     # the reference or a neighbour
            kept += t == w
            total += 1
    assert kept == total if p == 1 else kept == 0 if p == 0 else 0.4 * total < kept < 0.6 * total
    assert oracle.propose(reqs[:1], [0]) == [[]]
    oracle.release("r0")
    assert "r0" not in oracle._by_request
    assert oracle.propose([_Req("x", [9], [])], [3]) == [[]]      # no reference: no draft


@pytest.mark.parametrize("case", ["plain", "stop", "length", "first", "logprobs"])
def test_append_verified_equals_append_sampled(case):
    """A verified request's tokens enter it at once as append_sampled would one by one:
    the same outputs, times, gaps, emitted ids and tokens, and end reason."""
    from collections import deque

    from engine.core.spec_decode import _until_end, append_verified
    from engine.outputs import StepOutput
    from engine.request import Request, RequestStatus, SamplingParams, append_sampled

    def make():
        req = Request("r", [1, 2, 3], SamplingParams(max_tokens=8 if case == "length" else 50,
                                                     temperature=0.0))
        req.stop_ids, req.status = frozenset({99}), RequestStatus.RUNNING
        if case != "first":
            req.output_token_ids += [4, 5, 6, 7]
            req.token_times += [0.5, 0.6, 0.7, 0.8]
        return req

    new = [11, 99, 12, 13] if case == "stop" else [11, 12, 13, 14]
    results = []
    for via_sampled in (True, False):
        req, itls, out = make(), deque(maxlen=100), StepOutput()
        if case == "logprobs":
            out.logprobs = []
        cut = _until_end(req, list(new))
        if via_sampled:
            ended = append_sampled([req] * len(cut), cut, 1.0, itls, out.request_ids,
                                   out.token_ids, None if out.logprobs is None
                                   else [None] * len(cut), out.logprobs)
            reason = ended[-1][1] if ended else None
        else:
            reason = append_verified(req, cut, 1.0, itls, out)
        results.append((req.output_token_ids, req.token_times, list(itls), out.request_ids,
                        out.token_ids, out.logprobs, reason))
    assert results[0] == results[1]
    assert results[0][-1] == {"stop": "stop", "length": "length"}.get(case)

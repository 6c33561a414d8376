"""kernels/logprobs.py top_logprobs against its torch twin (kernels/reference.py): the
sampled token's value and rank, the top n ids and values (in order; among equal values
any order), -inf entries (a cut or masked row) as distinct ids, normalised or not, rows
picked from the step's logits or given gathered. Under the Triton interpreter (the whole
run without CUDA, or test_kernels.py's child with CUDA), and on the GPU at the engine's
shape (151,936-token vocabulary, 32 rows) when CUDA is there."""
from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _check(tri, ref, src, tokens, n, normalize, rows=None):
    from engine.worker.logprobs import unpack_tensor
    got = tri.top_logprobs(src, tokens, n, normalize, rows)
    want = ref.top_logprobs(src, tokens, n, normalize, rows)
    assert got.dtype == torch.int32 and got.shape == want.shape == (tokens.shape[0], 2 * n + 3)
    (gi, gv, gr), (wi, wv, wr) = unpack_tensor(got), unpack_tensor(want)
    assert torch.equal(gi[:, 0], tokens.long()) and torch.equal(gr, wr)
    assert torch.equal(gv.isinf(), wv.isinf())
    fin = ~wv.isinf()
    assert torch.allclose(gv[fin], wv[fin], atol=2e-5, rtol=1e-5)
    # each listed id holds the value listed beside it, ids are distinct (the -inf ones
    # too), and where no other entry ties with it, the id is the twin's
    x = (src if rows is None else src[rows]).float()
    x = torch.log_softmax(x, dim=-1) if normalize else x
    for r in range(gi.shape[0]):
        ids = gi[r, 1:].tolist()
        assert len(set(ids)) == len(ids)
        for k, i in enumerate(ids):
            v = float(gv[r, 1 + k])
            assert (float(x[r, i]) == v) if v == float("-inf") else \
                abs(float(x[r, i]) - v) <= 2e-5 + 1e-5 * abs(v)
            if v != float("-inf") and int((x[r] == x[r, i]).sum()) == 1:
                assert i == int(wi[r, 1 + k])
    return gi, gv, gr


if INTERPRET:
    from kernels import reference as _ref
    from tests.kernels.kernel_helpers import seed, tri  # noqa: F401

    @pytest.fixture(params=[1, 64], ids=["one-program-a-row", "split-rows"])
    def sms(request, monkeypatch):
        """The SMs the split plan sees: 1 (a program a row) or 64 (rows split over
        several programs, the last one merging their lists)."""
        from kernels import logprobs
        monkeypatch.setattr(logprobs, "num_sms", lambda device: request.param)
        return request.param

    @pytest.mark.parametrize("n,normalize", [(0, True), (1, True), (5, True), (5, False),
                                             (20, True)])
    def test_top_logprobs_matches_reference(seed, sms, monkeypatch, n, normalize):
        from kernels import logprobs
        monkeypatch.setattr(logprobs, "BLOCK", 256)     # several tiles a row
        assert (logprobs.plan_splits(5, 1000, sms)[0] > 1) == (sms > 1)
        src = torch.randn(5, 1000) * 3
        src[1, 500] = src[1, 501] = src[1].max() + 1    # a tie at the top
        tokens = torch.tensor([0, 500, 999, 17, 640])
        _check(tri, _ref, src, tokens, n, normalize)

    def test_rows_picked_gathered_and_half_precision(seed, sms, monkeypatch):
        from kernels import logprobs
        monkeypatch.setattr(logprobs, "BLOCK", 128)
        src = (torch.randn(8, 700) * 2).to(torch.float16)
        rows = torch.tensor([6, 1, 3])
        tokens = torch.tensor([5, 699, 128])
        picked = _check(tri, _ref, src, tokens, 4, True, rows)
        gathered = _check(tri, _ref, src[rows].contiguous(), tokens, 4, True)
        assert all(torch.equal(a, b) for a, b in zip(picked, gathered))

    def test_cut_rows_fill_the_list_with_distinct_minus_inf_ids(sms, monkeypatch):
        """A processed row with fewer finite entries than n (top-k 3 of n = 8): its three
        finite entries first, then -inf ones as distinct ids; the rank counts finite
        entries above the token only."""
        from kernels import logprobs
        monkeypatch.setattr(logprobs, "BLOCK", 64)
        src = torch.full((2, 300), float("-inf"))
        src[0, [10, 200, 290]] = torch.tensor([1.0, 3.0, 2.0])
        src[1] = torch.randn(300)
        ids, values, ranks = _check(tri, _ref, src, torch.tensor([290, 7]), 8, True)
        assert ids[0, 1:4].tolist() == [200, 290, 10] and ranks[0] == 2
        assert values[0, 4:].isinf().all() and values[0, 1:4].isfinite().all()


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (and the compiled kernel, not the interpreter)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_top_logprobs_gpu_at_the_engine_shape(dtype):
    """32 of 256 rows of a 151,936-token vocabulary (the TUI's workload), top 5 and 20,
    normalised and not, against the torch twin on the GPU."""
    from kernels import get_ops
    from kernels import reference as ref
    tri = get_ops("triton")
    torch.manual_seed(0)
    logits = (torch.randn(256, 151936, device="cuda") * 4).to(dtype)
    rows = torch.arange(3, 256, 8, device="cuda")
    tokens = logits.argmax(-1).index_select(0, rows)
    for n in (5, 20):
        for normalize in (True, False):
            _check(tri, ref, logits, tokens, n, normalize, rows)
    cut = logits.float()
    cut[:, 1000:] = float("-inf")                     # fewer finite than n in none...
    cut[7, 3:] = float("-inf")                        # ...but row 7: three finite
    _check(tri, ref, cut, torch.tensor([0] * 32, device="cuda"), 5, True, rows // 8)

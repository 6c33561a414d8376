"""Shared by the interpreter kernel tests (tests/kernels/test_kernels.py, test_kernels_more.py):
import only with TRITON_INTERPRET=1 set (the child process test_kernels.py starts).
Inputs are random with a fresh seed per test (printed on failure; set ROSEPLAY_TEST_SEED
to replay one), outputs are poisoned with NaN."""
import os
import random

import pytest
import torch

from kernels import get_ops
from kernels import reference as ref

tri = get_ops("triton")
DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


@pytest.fixture
def seed():
    s = int(os.environ.get("ROSEPLAY_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(s)
    return s


@pytest.fixture
def poison(monkeypatch):
    """Every torch.empty / empty_like (the kernels' outputs and partial buffers) comes
    back filled with NaN (floats) or a huge value (ints), so unwritten or wrongly read
    elements show up."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(2**30 if t.dtype != torch.int8 else 100)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))


def assert_close(out, expected, dtype, seed, what=""):
    assert out.shape == expected.shape, (out.shape, expected.shape)
    assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
    assert not torch.isnan(out).any(), f"{what}: NaN in output (seed {seed})"
    o, e = out.double(), expected.double()
    rel = ((o - e).norm() / e.norm().clamp_min(1e-12)).item()
    assert rel < TOL[dtype], f"{what}: rel err {rel:.2e} (seed {seed})"
    # absolute error grows with the operands' size: an output near 0 among outputs in the
    # thousands (fp8 caches with scales up to 16) carries their rounding, not its own
    size = max(1.0, e.abs().max().item())
    assert torch.allclose(o, e, atol=10 * TOL[dtype] * size, rtol=10 * TOL[dtype]), \
        f"{what}: max abs err {(o - e).abs().max().item():.2e} (seed {seed})"


def make_paged(seq_lens, block_size, h_kv, d, dtype, spare=3):
    """Random caches and random (shuffled, non-contiguous) block tables."""
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(need) + spare
    k_cache = torch.randn(num_blocks, block_size, h_kv, d).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, h_kv, d).to(dtype)
    perm = torch.randperm(num_blocks)
    width = max(need + [1]) + 1
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    i = 0
    for b, nb in enumerate(need):
        tables[b, :nb] = perm[i:i + nb].int()
        i += nb
    return k_cache, v_cache, tables


def dtype_pairs(names: str, *axes, ids=None):
    """parametrize("dtype," + names) over the cross product of `axes`, each combination
    once with the dtype taken in turn (DTYPES[sum of its axis indices % 2]): every case,
    split and tile choice runs, and each value of an axis meets both dtypes where it
    pairs with two or more others, at half the interpreter time of the full product
    (tests/kernels/test_kernels_gpu*.py run the full grids on a GPU). `ids`: one id
    function per axis (default str)."""
    import itertools
    ids = ids or [str] * len(axes)
    params = []
    for picks in itertools.product(*(list(enumerate(a)) for a in axes)):
        dtype = DTYPES[sum(i for i, _ in picks) % len(DTYPES)]
        tag = "-".join([str(f(v)) for f, (_, v) in zip(ids, picks)] + [str(dtype)[6:]])
        params.append(pytest.param(dtype, *(v for _, v in picks), id=tag))
    return pytest.mark.parametrize("dtype," + names, params)

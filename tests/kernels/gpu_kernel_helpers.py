"""Shared by the GPU kernel tests (tests/kernels/test_kernels_gpu*.py): tolerances, the Triton
backend fixture (skipped under TRITON_INTERPRET=1), seeds, paged caches."""
from __future__ import annotations

import os
import random

import pytest
import torch

# bf16 operands: 1e-3..1e-2 relative; fp32 with exact (ieee) dots: far below 1e-4
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 1e-4}
DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture(scope="module")
def tri():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set: GPU tests need compiled kernels")
    from kernels import get_ops
    return get_ops("triton")


@pytest.fixture
def seed():
    s = int(os.environ.get("ROSEPLAY_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(s)
    return s


def rel_err(out, expected):
    o, e = out.double(), expected.double()
    return ((o - e).norm() / e.norm().clamp_min(1e-12)).item()


def check(out, expected, dtype, seed, what):
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.isfinite(out).all(), f"{what}: non-finite output (seed {seed})"
    err = rel_err(out, expected)
    assert err < TOL[dtype], f"{what}: rel err {err:.2e} (seed {seed})"


def paged(lens, block_size, h_kv, d, dtype, spare=16):
    need = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(need) + spare
    k_cache = torch.randn(num_blocks, block_size, h_kv, d, device="cuda").to(dtype)
    v_cache = torch.randn(num_blocks, block_size, h_kv, d, device="cuda").to(dtype)
    perm = torch.randperm(num_blocks, device="cuda")
    tables = torch.zeros(len(lens), max(need) + 3, dtype=torch.int32, device="cuda")
    i = 0
    for b, nb in enumerate(need):
        tables[b, :nb] = perm[i:i + nb].int()
        i += nb
    return k_cache, v_cache, tables

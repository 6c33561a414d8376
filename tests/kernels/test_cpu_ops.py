"""The CPU backend's paged attention (kernels/cpu_ops.py) against kernels/reference.py:
decode and extend, GQA, ragged contexts and chunks, cached prefixes, a sequence with no
context or no new tokens, reduced-precision caches; and greedy tokens of the bundled
model equal under both backends."""
from __future__ import annotations

import pytest
import torch

from kernels import cpu_ops, get_ops
from kernels import reference as ref


def _caches(num_blocks, block_size, n_kv, d, dtype, gen):
    shape = (num_blocks, block_size, n_kv, d)
    return (torch.randn(shape, generator=gen).to(dtype),
            torch.randn(shape, generator=gen).to(dtype))


def _tables(lens, block_size, num_blocks, gen):
    width = max(1, max(-(-n // block_size) for n in lens)) + 2        # padded wider
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    for b, n in enumerate(lens):
        need = -(-n // block_size)
        table[b, :need] = torch.randperm(num_blocks, generator=gen)[:need].int()
    return table


TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_heads,n_kv", [(8, 4), (4, 4), (6, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_decode_matches_reference(dtype, n_heads, n_kv, seed):
    gen = torch.Generator().manual_seed(seed)
    block_size, d = 4, 16
    lens = [1, 7, 0, 33, 16]                          # 0: no context -> zeros
    kc, vc = _caches(64, block_size, n_kv, d, dtype, gen)
    table = _tables(lens, block_size, 64, gen)
    q = torch.randn(len(lens), n_heads, d, generator=gen).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    want = ref.paged_decode_attention(q, kc, vc, table, ctx, d ** -0.5)
    got = cpu_ops.paged_decode_attention(q, kc, vc, table, ctx, d ** -0.5)
    assert got.dtype == q.dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert got[2].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_extend_matches_reference(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    block_size, d, n_heads, n_kv = 4, 16, 8, 2
    new = [5, 1, 0, 12, 3]                            # 0: a sequence with no new tokens
    cached = [0, 9, 4, 6, 13]                         # prefix already in the cache
    lens = [n + c for n, c in zip(new, cached)]
    kc, vc = _caches(96, block_size, n_kv, d, dtype, gen)
    table = _tables(lens, block_size, 96, gen)
    q = torch.randn(sum(new), n_heads, d, generator=gen).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    args = (q, kc, vc, table, cu, ctx, max(new), d ** -0.5)
    torch.testing.assert_close(cpu_ops.paged_extend_attention(*args).float(),
                               ref.paged_extend_attention(*args).float(),
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_backend_exports_every_op():
    names = [n for n in dir(ref) if not n.startswith("_") and callable(getattr(ref, n))
             and getattr(getattr(ref, n), "__module__", "") == "kernels.reference"]
    backend = get_ops("torch_sdpa")
    assert backend is cpu_ops
    assert all(callable(getattr(backend, n, None)) for n in names), names


def test_bundled_model_greedy_tokens_equal_across_backends():
    from engine.front.llm import LLM
    from engine.request import SamplingParams
    prompts = ["ROMEO:", "To be, or not to be", "KING HENRY:\nWhat", "O"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for backend in ("torch", "torch_sdpa"):
        llm = LLM(device="cpu", attention_backend=backend, num_blocks=64,
                  max_num_batched_tokens=16)               # chunked prefill + decode mixed
        assert llm.engine.backend == backend
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        llm.engine.close()
    assert outs["torch"] == outs["torch_sdpa"]
    assert all(len(t) == 24 for t in outs["torch"])

"""FP8 KV on the CPU's torch paths: the quantization rule (kernels/kv_quant.py), the
reference's store and attention over fp8 caches, and the CPU SDPA backend
(kernels/cpu_ops.py, kernels/cpu_rotary.py) against the reference."""
from __future__ import annotations

import pytest
import torch

from kernels import cpu_ops, cpu_rotary
from kernels import reference as ref
from kernels.kv_quant import (CALIBRATION_TARGET, FP8_DTYPE, FP8_MAX, dequantize, quantize,
                              scales_from)


def _same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_quantize_saturates_rounds_and_scales_per_head():
    x = torch.tensor([[[1.0, 500.0, -1e6, 0.3]], [[2.0, 2.0, 2.0, -2.0]]])   # [T=2, H=1, 4]
    q = quantize(x, FP8_DTYPE, torch.tensor([1.0]))
    assert q.dtype == FP8_DTYPE
    assert q.float()[0, 0].tolist() == [1.0, FP8_MAX, -FP8_MAX, 0.3125]      # never NaN
    two = quantize(torch.full((1, 2, 3), 6.0), FP8_DTYPE, torch.tensor([2.0, 0.5]))
    assert two.float()[0, :, 0].tolist() == [3.0, 12.0]                        # 6/2, 6/0.5
    back = dequantize(two, torch.tensor([2.0, 0.5]), torch.float32)
    assert torch.equal(back, torch.full((1, 2, 3), 6.0))


def test_roundtrip_error_is_e4m3s_half_ulp():
    """Normal-range values come back within 2^-4 relative (3 mantissa bits, round to
    nearest); bfloat16 through the same path too."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, 32, generator=gen) * 20
    scale = scales_from(x)
    back = dequantize(quantize(x, FP8_DTYPE, scale), scale, torch.float32)
    normal = x.abs() > scale[:, None] * 2 ** -6
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2 ** -4 + 1e-7
    assert dequantize(quantize(x, FP8_DTYPE, scale), scale, torch.bfloat16).dtype == \
        torch.bfloat16


def test_scales_from_maps_each_heads_max_to_the_target():
    x = torch.zeros(5, 3, 8)
    x[2, 0, 1], x[4, 1, 7] = -10.0, 300.0                 # head 2 all zeros: scale 1
    s = scales_from(x)
    assert torch.allclose(s, torch.tensor([10.0 / CALIBRATION_TARGET,
                                           300.0 / CALIBRATION_TARGET, 1.0]))
    assert quantize(x, FP8_DTYPE, s).float().abs().amax().item() == CALIBRATION_TARGET
    assert torch.equal(scales_from(torch.zeros(0, 2, 4)), torch.ones(2))


def test_scales_refused_for_a_float_cache():
    with pytest.raises(ValueError, match="fp8 cache only"):
        quantize(torch.ones(1, 1, 2), torch.float32, torch.ones(1))


def _paged(lens, block_size, n_kv, d, gen):
    num_blocks = sum(-(-n // block_size) for n in lens) + 4
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(lens), max(1, max(-(-n // block_size) for n in lens)) + 2,
                        dtype=torch.int32)
    i = 0
    for b, n in enumerate(lens):
        need = -(-n // block_size)
        table[b, :need], i = perm[i:i + need].int(), i + need
    ks = torch.rand(n_kv, generator=gen) + 0.1
    vs = torch.rand(n_kv, generator=gen) + 0.1
    shape = (num_blocks, block_size, n_kv, d)
    kc = quantize(torch.randn(shape, generator=gen) * 3, FP8_DTYPE, ks)
    vc = quantize(torch.randn(shape, generator=gen) * 3, FP8_DTYPE, vs)
    return kc, vc, table, ks, vs


@pytest.mark.parametrize("n_heads,n_kv", [(8, 4), (6, 1)])
def test_reference_store_then_attend_reads_dequantized_values(n_heads, n_kv):
    """Stored through the reference (slot -1 skipped), attended through it: the float
    attention over codes x scales."""
    gen = torch.Generator().manual_seed(1)
    d, block_size, lens = 16, 4, [1, 7, 0, 33]
    kc, vc, table, ks, vs = _paged(lens, block_size, n_kv, d, gen)
    key, value = torch.randn(3, n_kv, d, generator=gen), torch.randn(3, n_kv, d, generator=gen)
    slots = torch.tensor([0, -1, 5])
    before = kc.clone()
    ref.store_kv_cache(key, value, kc, vc, slots, k_scale=ks, v_scale=vs)
    flat = kc.view(-1, n_kv, d)
    assert _same_bytes(flat[5], quantize(key[2:], FP8_DTYPE, ks)[0])
    assert _same_bytes(flat[1:5], before.view(-1, n_kv, d)[1:5])
    q = torch.randn(len(lens), n_heads, d, generator=gen)
    ctx = torch.tensor(lens, dtype=torch.int32)
    got = ref.paged_decode_attention(q, kc, vc, table, ctx, 0.25, k_scale=ks, v_scale=vs)
    want = ref.paged_decode_attention(q, dequantize(kc, ks, torch.float32),
                                      dequantize(vc, vs, torch.float32), table, ctx, 0.25)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1])
def test_cpu_sdpa_matches_reference_over_fp8(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    d, block_size, n_heads, n_kv = 16, 4, 8, 2
    new, cached = [5, 1, 0, 12], [0, 9, 4, 6]
    lens = [n + c for n, c in zip(new, cached)]
    kc, vc, table, ks, vs = _paged(lens, block_size, n_kv, d, gen)
    sc = dict(k_scale=ks, v_scale=vs)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=6e-2, rtol=3e-2)
    q = torch.randn(len(lens), n_heads, d, generator=gen).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    torch.testing.assert_close(
        cpu_ops.paged_decode_attention(q, kc, vc, table, ctx, 0.25, **sc).float(),
        ref.paged_decode_attention(q, kc, vc, table, ctx, 0.25, **sc).float(), **tol)
    qe = torch.randn(sum(new), n_heads, d, generator=gen).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    args = (qe, kc, vc, table, cu, ctx, max(new), 0.25)
    torch.testing.assert_close(cpu_ops.paged_extend_attention(*args, **sc).float(),
                               ref.paged_extend_attention(*args, **sc).float(), **tol)


def test_cpu_rotary_store_quantizes_like_the_reference():
    gen = torch.Generator().manual_seed(2)
    t, h, n_kv, d = 5, 4, 2, 16
    qkv = torch.randn(t, h + 2 * n_kv, d, generator=gen) * 4
    query, key, value = qkv[:, :h], qkv[:, h:h + n_kv], qkv[:, h + n_kv:]
    cos_sin = torch.randn(32, d, generator=gen)
    positions, slots = torch.randint(0, 32, (t,), generator=gen), torch.tensor([3, 0, 9, 4, 1])
    ks, vs = torch.tensor([0.5, 2.0]), torch.tensor([1.5, 0.25])
    runs = []
    for fn in (cpu_rotary.rotary_store_kv, ref.rotary_store_kv):
        kc = torch.zeros(4, 4, n_kv, d, dtype=FP8_DTYPE)
        vc = torch.zeros_like(kc)
        runs.append((fn(positions, query, key, value, cos_sin, True, kc, vc, slots,
                        k_scale=ks, v_scale=vs), kc, vc))
    (q, kc, vc), (q_ref, kc_ref, vc_ref) = runs
    torch.testing.assert_close(q, q_ref)
    # the two rotations may differ in the last float32 bit, which can move a code by one
    diff = (kc.float() - kc_ref.float()).abs() / kc_ref.float().abs().clamp_min(1e-3)
    assert diff.max() <= 2 ** -3 and (diff > 0).float().mean() < 0.02
    assert _same_bytes(vc, vc_ref)

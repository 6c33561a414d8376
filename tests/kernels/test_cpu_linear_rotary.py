"""The CPU backend's linears (oneDNN on packed weights, kernels/cpu_linear.py) and its
rotary + KV store (kernels/cpu_rotary.py) against kernels/reference.py: values, the
packed copy's life (made once, redone after an in-place change), and every fallback."""
from __future__ import annotations

import pytest
import torch

from kernels import cpu_linear, cpu_rotary
from kernels import reference as ref


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("rows", [1, 16, 37])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_reference(rows, bias):
    x, w = _randn(rows, 64, seed=1), _randn(96, 64, seed=2)
    b = _randn(96, seed=3) if bias else None
    torch.testing.assert_close(cpu_linear.linear(x, w, b), ref.linear(x, w, b),
                               atol=2e-5, rtol=2e-5)
    x3 = _randn(2, rows, 64, seed=4)                 # leading dims kept
    assert cpu_linear.linear(x3, w, b).shape == (2, rows, 96)


def test_fused_linears_match_reference():
    x, res = _randn(9, 64, seed=1), _randn(9, 64, seed=2)
    norm_w, w = _randn(64, seed=3), _randn(48, 64, seed=4)
    got, got_res = cpu_linear.rms_norm_linear(x, norm_w, 1e-5, w, None, res)
    want, want_res = ref.rms_norm_linear(x, norm_w, 1e-5, w, None, res)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got_res, want_res)
    gate_up, down = _randn(9, 128, seed=5), _randn(32, 64, seed=6)
    torch.testing.assert_close(cpu_linear.silu_mul_linear(gate_up, down),
                               ref.silu_mul_linear(gate_up, down), atol=2e-5, rtol=2e-5)


def test_weight_is_packed_once_and_repacked_after_a_change():
    if cpu_linear.packed_weight(_randn(8, 8)) is None:
        pytest.skip("torch without oneDNN: the reference runs")
    w, x = _randn(32, 16, seed=1), _randn(4, 16, seed=2)
    first = cpu_linear.packed_weight(w)
    assert cpu_linear.packed_weight(w) is first           # kept on the tensor
    with torch.no_grad():
        w.mul_(2.0)                                      # in place: version bumps
    assert cpu_linear.packed_weight(w) is not first
    torch.testing.assert_close(cpu_linear.linear(x, w), x @ w.t(), atol=2e-5, rtol=2e-5)


def test_only_skinny_inputs_take_onednn(monkeypatch):
    """Wide inputs (prefill chunks) go to F.linear: oneDNN keeps a JIT kernel per row
    count, and a mixed step's arbitrary token counts grew the engine's memory."""
    if cpu_linear.packed_weight(_randn(8, 8)) is None:
        pytest.skip("torch without oneDNN: the reference runs")
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(cpu_linear.torch.ops.mkldnn, "_linear_pointwise",
                        lambda x, *a: calls.append(x.shape[0]) or real(x, *a), raising=False)
    w = _randn(32, 16, seed=1)
    limit = cpu_linear.ONEDNN_MAX_ROWS
    for rows in (1, limit, limit + 1, 4 * limit + 3):
        x = _randn(rows, 16, seed=rows)
        torch.testing.assert_close(cpu_linear.linear(x, w), x @ w.t(), atol=2e-5, rtol=2e-5)
    assert calls == [1, limit]


def test_half_weights_use_the_reference():
    x, w = _randn(4, 16, dtype=torch.float16), _randn(8, 16, seed=1, dtype=torch.float16)
    assert cpu_linear.packed_weight(w) is None
    assert torch.equal(cpu_linear.linear(x, w), ref.linear(x, w))


def test_bfloat16_linears_run_on_any_cpu():
    """bfloat16 is packed for oneDNN only where the CPU converts it natively; elsewhere
    (no AVX-512 BW/VL/DQ, no AVX-NE-CONVERT) oneDNN's reorder raises, so the weight must
    stay unpacked and the linear still run (every decode step failed there before)."""
    x, w = _randn(4, 16, dtype=torch.bfloat16), _randn(8, 16, seed=1, dtype=torch.bfloat16)
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert (cpu_linear.packed_weight(w) is not None) == (native and cpu_linear._ONEDNN)
    y = cpu_linear.linear(x, w)
    torch.testing.assert_close(y.float(), x.float() @ w.float().t(), atol=3e-2, rtol=3e-2)
    y2 = cpu_linear.rms_norm_linear(x, torch.ones(16, dtype=torch.bfloat16), 1e-6, w)
    assert y2.shape == (4, 8) and torch.isfinite(y2.float()).all()


def _qkv(tokens, heads, kv_heads, d, seed=0):
    """q, k, v as the model makes them: split views of one fused projection."""
    qkv = _randn(tokens, (heads + 2 * kv_heads) * d, seed=seed)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return (q.reshape(tokens, heads, d), k.reshape(tokens, kv_heads, d),
            v.reshape(tokens, kv_heads, d))


@pytest.mark.parametrize("layout", ["fused", "separate"])
@pytest.mark.parametrize("slots", [[0, 5, 17, 33, 2], [0, -1, 17, 33, -1]])
@pytest.mark.parametrize("is_neox,rot_dim", [(True, 32), (False, 32), (True, 16)])
def test_rotary_store_kv_matches_reference(layout, slots, is_neox, rot_dim):
    q, k, v = _qkv(5, 8, 4, 32)
    if layout == "separate":
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    assert (cpu_rotary._joined(q, k) is not None) == (layout == "fused")
    positions = torch.tensor([3, 7, 9, 50, 1])
    cos_sin = _randn(64, rot_dim, seed=9)
    slot_mapping = torch.tensor(slots)
    caches = {name: (torch.zeros(8, 8, 4, 32), torch.zeros(8, 8, 4, 32))
              for name in ("got", "want")}
    got = cpu_rotary.rotary_store_kv(positions, q, k, v, cos_sin, is_neox, *caches["got"],
                                     slot_mapping)
    want = ref.rotary_store_kv(positions, q, k, v, cos_sin, is_neox, *caches["want"],
                               slot_mapping)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for got_cache, want_cache in zip(caches["got"], caches["want"]):
        torch.testing.assert_close(got_cache, want_cache, atol=1e-6, rtol=1e-6)
    assert caches["got"][1].flatten(0, 1)[17].abs().sum() > 0     # a stored slot

"""FP8 KV caches: every Triton kernel that reads or writes the cache against its torch
reference, on the CPU under the Triton interpreter (float8e4nv loads, stores and
conversions work there).

Like tests/kernels/test_kernels.py: without CUDA the run has TRITON_INTERPRET=1
(tests/conftest.py); with CUDA one test re-runs this file in a child pytest with it set.

The interpreter's float32 -> float8 rounding is not the hardware's (Triton 3.6
`_convert_float`: ties away from zero, subnormals truncated, a mantissa carry into the
exponent lost, so 7.95 becomes 4.0), while fp8 -> float is exact. So values the kernels
*store* are built to land exactly on the e4m3 grid here (codes times power-of-two
scales; rotations by multiples of 90 degrees), and the stores are compared byte for
byte; tests/kernels/test_kernels_gpu_fp8.py compares random values on the GPU. Attention
reads caches the torch quantizer filled, with random per-head scales. The interpreter is
slow, so each kernel runs a few cases, each one of the query dtypes and shapes paired
(every dtype, GQA group, split and block size is in some case); the GPU file runs every
kernel in every dtype at engine shapes.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

if os.environ.get("TRITON_INTERPRET") != "1":

    def test_interpreter_suite():
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        env = dict(os.environ, TRITON_INTERPRET="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p",
                               "no:cacheprovider", "-o", "addopts=", "--rootdir", str(REPO)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        print(proc.stdout[-4000:])
        assert proc.returncode == 0, f"{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"

else:
    import torch

    from kernels.kv_quant import FP8_DTYPE, FP8_MAX, quantize
    from kernels.unified_attention import paged_unified_attention, unified_attention_reference
    from tests.kernels.kernel_helpers import (DTYPES, assert_close, make_paged, poison,  # noqa: F401
                                              ref, seed, tri)

    def grid_values(*shape, scale=None):
        """Random float32 values that are e4m3 codes times the head's scale (heads on
        dim -2): exact after division by a power-of-two scale, whatever the rounding."""
        codes = (torch.randn(*shape) * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float()
        return codes if scale is None else codes * scale[:, None]

    def pow2_scales(heads):
        return 2.0 ** torch.randint(-4, 5, (heads,)).float()

    def random_scales(heads):
        return torch.rand(heads) * 0.5 + 0.05

    def fp8_paged(lens, page, h_kv, d):
        """Caches quantized by torch with random per-head scales, and the tables."""
        k, v, tables = make_paged(lens, page, h_kv, d, torch.float32)
        ks, vs = random_scales(h_kv), random_scales(h_kv)
        return (quantize(k * 4, FP8_DTYPE, ks), quantize(v * 4, FP8_DTYPE, vs), tables,
                ks, vs)

    def same_bytes(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    # ------------------------------------------------------------------ stores
    @pytest.mark.parametrize("dtype,block_size,h_kv,d", [(DTYPES[0], 16, 2, 32),
                                                         (DTYPES[1], 4, 3, 16)])
    def test_store_kv_cache_fp8(seed, dtype, block_size, h_kv, d):
        """Byte-equal to the reference: per-head scales, strided inputs, slot -1 skipped,
        values past ±448·scale saturated (never NaN)."""
        num_blocks, t = 6, 11
        slots = torch.randperm(num_blocks * block_size)[:t]
        skip = torch.rand(t) < 0.3
        skip[0] = False
        slots[skip] = -1
        ks, vs = pow2_scales(h_kv), pow2_scales(h_kv)
        qkv = torch.cat((torch.randn(t, 2, d), grid_values(t, h_kv, d, scale=ks),
                         grid_values(t, h_kv, d, scale=vs)), 1).to(dtype)
        qkv[0, 2, 0] = 1000.0 * ks[0]                # saturates to +448
        qkv[0, 2 + h_kv, 1] = -1000.0 * vs[0]        # saturates to -448
        key, value = qkv[:, 2:2 + h_kv], qkv[:, 2 + h_kv:]
        caches = [grid_values(num_blocks, block_size, h_kv, d).to(FP8_DTYPE) for _ in range(2)]
        got, want = [c.clone() for c in caches], [c.clone() for c in caches]
        tri.store_kv_cache(key, value, *got, slots, k_scale=ks, v_scale=vs)
        ref.store_kv_cache(key, value, *want, slots, k_scale=ks, v_scale=vs)
        assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1]), f"seed {seed}"
        s0 = int(slots[0])
        assert got[0].view(-1, h_kv, d)[s0, 0, 0].float() == FP8_MAX
        assert got[1].view(-1, h_kv, d)[s0, 0, 1].float() == -FP8_MAX
        assert not torch.isnan(got[0].float()).any()

    def test_scales_only_with_an_fp8_cache():
        k = torch.randn(2, 2, 16)
        caches = [torch.zeros(2, 4, 2, 16) for _ in range(2)]
        with pytest.raises(ValueError, match="fp8 cache only"):
            tri.store_kv_cache(k, k, *caches, torch.tensor([0, 1]), k_scale=torch.ones(2))
        f8 = [c.to(FP8_DTYPE) for c in caches]
        with pytest.raises(ValueError, match="one per KV head"):
            tri.store_kv_cache(k, k, *f8, torch.tensor([0, 1]), k_scale=torch.ones(3))

    def quarter_turns(max_pos, d):
        """A cos | sin cache whose every angle is a multiple of 90 degrees: rotations
        that keep grid values on the grid (each output is ± one input)."""
        turns = torch.randint(0, 4, (max_pos, d // 2)).float() * (torch.pi / 2)
        return torch.cat((turns.cos().round(), turns.sin().round()), -1)

    @pytest.mark.parametrize("dtype,is_neox", [(DTYPES[0], True), (DTYPES[1], False)])
    def test_rotary_store_kv_fp8(seed, poison, dtype, is_neox):
        t, h, h_kv, d, page, blocks = 7, 6, 2, 32, 4, 5
        positions = torch.randint(0, 64, (t,))
        ks, vs = pow2_scales(h_kv), pow2_scales(h_kv)
        qkv = torch.cat((torch.randn(t, h, d), grid_values(t, h_kv, d, scale=ks),
                         grid_values(t, h_kv, d, scale=vs)), 1).to(dtype)
        query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        slots = torch.randperm(blocks * page)[:t]
        slots[1] = -1
        cos_sin = quarter_turns(64, d)
        runs = []
        for ops in (tri, ref):
            kc = torch.zeros(blocks, page, h_kv, d, dtype=FP8_DTYPE)
            vc = torch.zeros_like(kc)
            q = ops.rotary_store_kv(positions, query, key, value, cos_sin, is_neox, kc, vc,
                                    slots, k_scale=ks, v_scale=vs)
            runs.append((q, kc, vc))
        (q, kc, vc), (q_ref, kc_ref, vc_ref) = runs
        assert torch.equal(q, q_ref), f"seed {seed}"
        assert same_bytes(kc, kc_ref) and same_bytes(vc, vc_ref), f"seed {seed}"

    # --------------------------------------------------------------- attention
    DECODE_CASES = [(1, 2, 32, 16, [1, 17, 40]), (7, 1, 16, 4, [9, 33]),
                    (2, 3, 64, 8, [64, 3])]

    @pytest.mark.parametrize("dtype,case,splits", [
        (DTYPES[0], DECODE_CASES[0], None), (DTYPES[1], DECODE_CASES[1], 3),
        (DTYPES[0], DECODE_CASES[2], 3), (DTYPES[1], DECODE_CASES[2], None)])
    def test_decode_attention_fp8(seed, poison, dtype, case, splits):
        """Dequantized inside the kernel == the reference over the same fp8 cache (GQA
        groups 1/2/7, one split and several: the V scale after the merge)."""
        group, h_kv, d, page, lens = case
        kc, vc, tables, ks, vs = fp8_paged(lens, page, h_kv, d)
        q = torch.randn(len(lens), group * h_kv, d).to(dtype)
        ctx = torch.tensor(lens, dtype=torch.int32)
        out = tri.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, k_scale=ks,
                                         v_scale=vs, num_splits=splits)
        want = ref.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, k_scale=ks,
                                          v_scale=vs)
        assert_close(out, want, dtype, seed, f"decode fp8 {case}")

    def test_fp8_reference_is_attention_over_the_dequantized_cache(seed):
        """The reference's fp8 read is the float attention over codes × scales."""
        kc, vc, tables, ks, vs = fp8_paged([5, 30], 8, 2, 16)
        q, ctx = torch.randn(2, 4, 16), torch.tensor([5, 30], dtype=torch.int32)
        deq_k = kc.float() * ks[:, None]
        deq_v = vc.float() * vs[:, None]
        out = ref.paged_decode_attention(q, kc, vc, tables, ctx, 0.25, k_scale=ks, v_scale=vs)
        want = ref.paged_decode_attention(q, deq_k, deq_v, tables, ctx, 0.25)
        assert_close(out, want, torch.float32, seed, "dequantized")

    @pytest.mark.parametrize("dtype,splits", [(DTYPES[0], 2), (DTYPES[1], None)])
    def test_rotary_decode_attention_fp8(seed, poison, dtype, splits):
        """The fused launch (rotate, store the new token quantized, attend, its own
        position from registers) equals rotary_store_kv + decode attention bit for bit,
        caches included, and the reference within tolerance (caches byte-equal)."""
        group, h_kv, d, page, lens = 2, 2, 32, 8, [9, 24, 1]
        h = group * h_kv
        kc0, vc0, tables, _, _ = fp8_paged(lens, page, h_kv, d)
        ks, vs = pow2_scales(h_kv), pow2_scales(h_kv)
        ctx = torch.tensor(lens, dtype=torch.int32)
        positions = ctx.long() - 1
        slots = tables[torch.arange(len(lens)), positions // page].long() * page \
            + positions % page
        qkv = torch.cat((torch.randn(len(lens), h, d), grid_values(len(lens), h_kv, d, scale=ks),
                         grid_values(len(lens), h_kv, d, scale=vs)), 1).to(dtype)
        query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        args = (positions, query, key, value, quarter_turns(64, d), True)
        sc = dict(k_scale=ks, v_scale=vs)
        runs = {}
        for name, fn in [("fused", lambda kc, vc: tri.rotary_decode_attention(
                              *args, kc, vc, slots, tables, ctx, d ** -0.5, num_splits=splits,
                              **sc)),
                         ("composed", lambda kc, vc: tri.paged_decode_attention(
                              tri.rotary_store_kv(*args, kc, vc, slots, **sc), kc, vc, tables,
                              ctx, d ** -0.5, num_splits=splits, **sc)),
                         ("ref", lambda kc, vc: ref.rotary_decode_attention(
                              *args, kc, vc, slots, tables, ctx, d ** -0.5, **sc))]:
            kc, vc = kc0.clone(), vc0.clone()
            runs[name] = (fn(kc, vc), kc, vc)
        fused, composed, want = runs["fused"], runs["composed"], runs["ref"]
        assert torch.equal(fused[0], composed[0]), f"fused != composed (seed {seed})"
        assert same_bytes(fused[1], composed[1]) and same_bytes(fused[2], composed[2])
        assert same_bytes(fused[1], want[1]) and same_bytes(fused[2], want[2]), f"seed {seed}"
        assert_close(fused[0], want[0], dtype, seed, "rotary_decode_attention fp8")

    @pytest.mark.parametrize("dtype,splits", [(DTYPES[0], 2), (DTYPES[1], None)])
    def test_rotary_decode_attention_fp8_shared_rows(seed, poison, dtype, splits):
        """A verify step's rows of one sequence in one fused launch (rows_shared, the
        programs run last row first): each row takes its earlier rows' quantized K/V
        from registers, bit-equal to rotary_store_kv + decode attention, caches too."""
        group, h_kv, d, page, lens = 2, 2, 32, 8, [24, 9]
        h = group * h_kv
        kc0, vc0, tables, _, _ = fp8_paged(lens, page, h_kv, d)
        ks, vs = pow2_scales(h_kv), pow2_scales(h_kv)
        seq = torch.tensor([0, 0, 0, 0, 1])
        positions = torch.tensor([20, 21, 22, 23, 8])
        ctx = (positions + 1).to(torch.int32)
        rows_tables = tables[seq].contiguous()
        slots = tables[seq, positions // page].long() * page + positions % page
        t = len(seq)
        qkv = torch.cat((torch.randn(t, h, d), grid_values(t, h_kv, d, scale=ks),
                         grid_values(t, h_kv, d, scale=vs)), 1).to(dtype)
        query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        args = (positions, query, key, value, quarter_turns(64, d), True)
        sc = dict(k_scale=ks, v_scale=vs, num_splits=splits)
        order = torch.arange(t - 1, -1, -1, dtype=torch.int32)
        kc, vc = kc0.clone(), vc0.clone()
        fused = tri.rotary_decode_attention(*args, kc, vc, slots, rows_tables, ctx,
                                            d ** -0.5, rows_shared=True, order=order, **sc)
        kc2, vc2 = kc0.clone(), vc0.clone()
        q = tri.rotary_store_kv(*args, kc2, vc2, slots, k_scale=ks, v_scale=vs)
        composed = tri.paged_decode_attention(q, kc2, vc2, rows_tables, ctx, d ** -0.5,
                                              order=order, **sc)
        assert torch.equal(fused, composed), f"fused != composed (seed {seed})"
        assert same_bytes(kc, kc2) and same_bytes(vc, vc2)

    @pytest.mark.parametrize("dtype,group,h_kv,d,page", [(DTYPES[0], 1, 2, 32, 16),
                                                         (DTYPES[1], 7, 1, 16, 4)])
    def test_extend_attention_fp8(seed, poison, dtype, group, h_kv, d, page):
        """Chunks over a cached prefix and fresh prompts, crossing block boundaries."""
        news, lens = [3, 17, 1, 9], [3, 40, 20, 25]
        kc, vc, tables, ks, vs = fp8_paged(lens, page, h_kv, d)
        cu = torch.tensor([0] + news, dtype=torch.int32).cumsum(0).int()
        q = torch.randn(sum(news), group * h_kv, d).to(dtype)
        ctx = torch.tensor(lens, dtype=torch.int32)
        out = tri.paged_extend_attention(q, kc, vc, tables, cu, ctx, max(news), d ** -0.5,
                                         k_scale=ks, v_scale=vs)
        want = ref.paged_extend_attention(q, kc, vc, tables, cu, ctx, max(news), d ** -0.5,
                                          k_scale=ks, v_scale=vs)
        assert_close(out, want, dtype, seed, "extend fp8")

    @pytest.mark.parametrize("dtype", DTYPES[1:])
    def test_unified_attention_fp8(seed, poison, dtype):
        """Decodes and chunks in one padded launch (padding tokens and unused slots)."""
        mix = [(1, 5), (1, 17), (9, 9), (6, 22), (13, 45)]
        h, h_kv, d, page, pad_tokens, pad_seqs = 4, 2, 32, 8, 5, 3
        news, ctxs = [n for n, _ in mix], [c for _, c in mix]
        kc, vc, tables, ks, vs = fp8_paged(ctxs + [1] * pad_seqs, page, h_kv, d)
        real = sum(news)
        q = torch.randn(real + pad_tokens, h, d).to(dtype)
        qsl = torch.tensor([0] + news + [0] * pad_seqs, dtype=torch.int32).cumsum(0).int()
        lens = torch.tensor(ctxs + [7] * pad_seqs, dtype=torch.int32)
        out = paged_unified_attention(q, kc, vc, tables, qsl, lens, d ** -0.5, k_scale=ks,
                                      v_scale=vs)
        want = unified_attention_reference(q, kc, vc, tables, qsl, lens, d ** -0.5,
                                           k_scale=ks, v_scale=vs)
        assert_close(out[:real], want[:real], dtype, seed, "unified fp8")
        assert torch.isnan(out[real:]).all(), "padding rows must not be written"

"""Triton kernels vs kernels/reference.py on the CPU, under the Triton interpreter.

TRITON_INTERPRET=1 must be set before any @triton.jit decorator runs, and it then holds
for the whole process: a GPU test importing the kernels later in the same pytest process
would get interpreted kernels (and graph capture would break). Without CUDA,
tests/conftest.py sets it for the whole run and the real tests below run in it; with CUDA
a run collects a single test here, which re-runs this file and test_kernels_more.py in a
child pytest with TRITON_INTERPRET=1. Inputs are random with a fresh seed per test (printed on failure; set
ROSEPLAY_TEST_SEED to replay one), outputs are poisoned with NaN, shapes are tiny, and
float32 / float16 only (bfloat16 dots are broken in the interpreter).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
REPO = Path(__file__).resolve().parents[2]

if not INTERPRET:

    def test_interpreter_suite():
        """Run the interpreter kernel tests in a child process with TRITON_INTERPRET=1."""
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        here = Path(__file__).resolve()
        cmd = [sys.executable, "-m", "pytest", str(here),
               str(here.with_name("test_kernels_more.py")),
               str(here.with_name("test_logprobs_kernel.py")), "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(REPO)]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        print(proc.stdout[-6000:])
        assert proc.returncode == 0, (
            f"interpreter kernel tests failed (rc={proc.returncode}):\n"
            f"{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}")

else:
    import torch

    from tests.kernels.kernel_helpers import (DTYPES, assert_close, dtype_pairs, make_paged,  # noqa: F401
                                              poison, ref, seed, tri)

    def test_backend_exports():
        for name in ["store_kv_cache", "paged_decode_attention", "paged_extend_attention",
                     "rms_norm", "rotary_embedding", "silu_and_mul", "linear",
                     "rms_norm_linear", "silu_mul_linear", "rotary_store_kv",
                     "rotary_decode_attention"]:
            assert callable(getattr(tri, name))

    # ----------------------------------------------------------------- store_kv_cache
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("block_size,h_kv,d", [(16, 2, 32), (4, 3, 16), (32, 1, 64)])
    def test_store_kv_cache(seed, dtype, block_size, h_kv, d):
        num_blocks, t = 6, 11
        slots = torch.randperm(num_blocks * block_size)[:t]
        slots[torch.rand(t) < 0.3] = -1
        # key/value as strided views of a fused projection, like the model produces
        qkv = torch.randn(t, 2 + 2 * h_kv, d).to(dtype)
        key, value = qkv[:, 2:2 + h_kv], qkv[:, 2 + h_kv:]
        caches = [torch.randn(num_blocks, block_size, h_kv, d).to(dtype) for _ in range(2)]
        got = [c.clone() for c in caches]
        want = [c.clone() for c in caches]
        tri.store_kv_cache(key, value, got[0], got[1], slots)
        ref.store_kv_cache(key, value, want[0], want[1], slots)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"seed {seed}"

    def test_store_kv_cache_casts(seed):
        key, value = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
        slots = torch.tensor([7, -1, 0, 12, 3])
        got = [torch.zeros(4, 4, 2, 16, dtype=torch.float16) for _ in range(2)]
        want = [c.clone() for c in got]
        tri.store_kv_cache(key, value, got[0], got[1], slots.int())
        ref.store_kv_cache(key, value, want[0], want[1], slots)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"seed {seed}"

    # ------------------------------------------------------------------ decode
    DECODE_CASES = [
        # (group, h_kv, d, block_size, context lens)
        (1, 2, 32, 16, [1, 37, 300]),
        (2, 2, 32, 16, [16, 5, 129]),
        (7, 2, 64, 16, [250, 1, 33]),
        (7, 1, 32, 4, [0, 61, 9]),
        (4, 2, 16, 32, [100, 32, 7]),
    ]

    def case_id(c):
        return f"g{c[0]}-kv{c[1]}-d{c[2]}-bs{c[3]}"

    @dtype_pairs("case,splits", DECODE_CASES, [None, 1, 3], ids=[case_id, str])
    def test_paged_decode_attention(seed, poison, dtype, case, splits):
        group, h_kv, d, block_size, lens = case
        h = group * h_kv
        k_cache, v_cache, tables = make_paged(lens, block_size, h_kv, d, dtype)
        ctx = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(len(lens), h + 2, d).to(dtype)[:, 1:h + 1]      # strided view
        scale = d ** -0.5
        out = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, scale,
                                         num_splits=splits)
        want = ref.paged_decode_attention(q, k_cache, v_cache, tables, ctx, scale)
        assert_close(out, want, dtype, seed, f"decode {case} splits={splits}")

    def test_paged_decode_attention_merge(seed, poison, monkeypatch):
        """The last split program's merge over ragged contexts (incl. 0 and 1), more splits
        than any context needs, called twice so the self-resetting merge counters are
        exercised; splits sized by each context (one tile each at the smallest: every
        split of a 70-token context holds a share of it). float16 only: the merge is
        float32 in either dtype, and test_paged_decode_attention's split cases run both."""
        import kernels.decode_attention as da
        dtype = torch.float16
        monkeypatch.setattr(da, "DYNAMIC_MIN_TOKENS", 16)
        group, h_kv, d, block_size = 7, 2, 32, 4
        for lens in ([0, 70, 1, 33], [19, 0, 64, 5]):
            k_cache, v_cache, tables = make_paged(lens, block_size, h_kv, d, dtype, spare=8)
            ctx = torch.tensor(lens, dtype=torch.int32)
            q = torch.randn(len(lens), group * h_kv, d).to(dtype)
            out = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5,
                                             num_splits=5, block_n=16)
            want = ref.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
            assert_close(out, want, dtype, seed, f"decode merge {lens}")
        from kernels._common import zeroed_scratch
        cnt = zeroed_scratch(q.device, "decode_counters", 1, torch.int32)
        assert int(cnt.abs().sum()) == 0, "merge counters not reset"

    def test_decode_plan_depends_on_shapes_only():
        from kernels.decode_attention import plan_splits
        assert plan_splits(1, 2, 512, 16, 128, 132) == plan_splits(1, 2, 512, 16, 128, 132)
        splits, per = plan_splits(1, 2, 512, 16, 128, 132)
        assert splits > 1 and per % 128 == 0 and splits * per >= 512 * 16
        assert plan_splits(256, 8, 4, 16, 128, 132)[0] == 1

    # ------------------------------------------------------------------ extend
    EXTEND_CASES = [
        # (group, h_kv, d, block_size, [(context len, new tokens), ...])
        (1, 2, 32, 16, [(5, 5), (37, 1), (50, 17), (0, 0), (16, 16)]),
        (2, 1, 32, 4, [(33, 9), (7, 2), (20, 20)]),
        (7, 2, 64, 16, [(40, 13), (1, 1), (70, 3)]),
    ]

    @dtype_pairs("case,block_m", EXTEND_CASES, [None, 16], ids=[case_id, str])
    def test_paged_extend_attention(seed, poison, dtype, case, block_m):
        group, h_kv, d, block_size, seqs = case
        h = group * h_kv
        lens = [c for c, _ in seqs]
        n_new = [n for _, n in seqs]
        k_cache, v_cache, tables = make_paged(lens, block_size, h_kv, d, dtype)
        ctx = torch.tensor(lens, dtype=torch.int32)
        cu = torch.tensor([0] + n_new, dtype=torch.int32).cumsum(0).int()
        q = torch.randn(sum(n_new), h, d).to(dtype)
        scale = d ** -0.5
        out = tri.paged_extend_attention(q, k_cache, v_cache, tables, cu, ctx, max(n_new),
                                         scale, block_m=block_m, block_n=16 if block_m else None)
        want = ref.paged_extend_attention(q, k_cache, v_cache, tables, cu, ctx, max(n_new),
                                          scale)
        assert_close(out, want, dtype, seed, f"extend {case} block_m={block_m}")

    # ------------------------------------------------------------- small kernels
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("with_residual", [False, True])
    def test_rms_norm(seed, poison, dtype, with_residual):
        x = torch.randn(2, 3, 96).to(dtype)
        w = (1 + 0.1 * torch.randn(96)).to(dtype)
        res = torch.randn(2, 3, 96).to(dtype) if with_residual else None
        x_before = x.clone()
        got = tri.rms_norm(x, w, 1e-6, res)
        want = ref.rms_norm(x, w, 1e-6, res)
        assert torch.equal(x, x_before)
        if with_residual:
            assert_close(got[0], want[0], dtype, seed, "rms_norm out")
            assert torch.equal(got[1], want[1]), f"new residual differs (seed {seed})"
        else:
            assert_close(got, want, dtype, seed, "rms_norm")

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_rms_norm_per_head_over_a_qkv_split(seed, poison, dtype):
        """qwen3's q/k norms: [T, H, D] views of the fused qkv output (row stride the qkv
        width), normed in place of a contiguous copy; 5 x 3 rows leave a tile part empty."""
        t, h, h_kv, d = 5, 3, 1, 32
        qkv = torch.randn(t, (h + 2 * h_kv) * d).to(dtype)
        before = qkv.clone()
        q, k, _ = qkv.split([h * d, h_kv * d, h_kv * d], dim=-1)
        q, k = q.reshape(t, h, d), k.reshape(t, h_kv, d)
        assert not q.is_contiguous()
        w = (1 + 0.1 * torch.randn(d)).to(dtype)
        for x in (q, k):
            got = tri.rms_norm(x, w, 1e-6)
            assert got.shape == x.shape
            assert_close(got, ref.rms_norm(x.contiguous(), w, 1e-6), dtype, seed, "rms_norm head")
        # q's and k's heads in one call, a weight row per head (float32, as the model's)
        qk = qkv[:, :(h + h_kv) * d].view(t, h + h_kv, d)
        rows = 1 + 0.1 * torch.randn(h + h_kv, d)
        got = tri.rms_norm(qk, rows, 1e-6)
        assert_close(got, ref.rms_norm(qk.contiguous(), rows, 1e-6), dtype, seed, "per-head w")
        assert torch.equal(qkv, before)
        with pytest.raises(ValueError, match="per-head weight"):
            tri.rms_norm(qk, rows[:-1], 1e-6)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("is_neox", [True, False])
    @pytest.mark.parametrize("rot_dim", [32, 16])
    def test_rotary_embedding(seed, poison, dtype, is_neox, rot_dim):
        t, h, h_kv, d, max_pos = 6, 4, 2, 32, 64
        positions = torch.randint(0, max_pos, (t,))
        qkv = torch.randn(t, h + 2 * h_kv, d).to(dtype)
        query, key = qkv[:, :h], qkv[:, h:h + h_kv]                    # strided views
        cos_sin = torch.randn(max_pos, rot_dim)
        q_before, k_before = query.clone(), key.clone()
        gq, gk = tri.rotary_embedding(positions, query, key, cos_sin, is_neox)
        wq, wk = ref.rotary_embedding(positions, query, key, cos_sin, is_neox)
        assert torch.equal(query, q_before) and torch.equal(key, k_before)
        assert_close(gq, wq, dtype, seed, "rope q")
        assert_close(gk, wk, dtype, seed, "rope k")

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_silu_and_mul(seed, poison, dtype):
        x = (3 * torch.randn(2, 5, 2 * 40)).to(dtype)
        assert_close(tri.silu_and_mul(x), ref.silu_and_mul(x), dtype, seed, "silu_and_mul")

    @pytest.mark.parametrize("n", [2, 5, 64, 65, 200])
    def test_decode_order_is_a_stable_descending_sort(seed, n):
        """decode_order's one launch ranks the rows as a stable descending argsort does
        (ties in row order), across block boundaries, and is a permutation."""
        ctx = torch.randint(0, 9, (n,), dtype=torch.int32)         # many ties
        order = tri.decode_order(ctx)
        assert order.dtype == torch.int32
        want = torch.argsort(ctx, descending=True, stable=True)
        assert order.long().tolist() == want.tolist(), f"seed {seed}"

    # ------------------------------------------- rotary + kv store + decode, fused
    @pytest.mark.parametrize("splits", [None, 3])
    def test_decode_in_longest_first_order_is_the_same_attention(seed, poison, splits):
        """decode_order's launch (programs run the longest contexts first) computes every
        row exactly as the launch in batch order, fused rotary launch included, caches too."""
        group, h_kv, d, page, lens = 2, 2, 32, 8, [9, 41, 1, 33, 0]
        h = group * h_kv
        k_cache, v_cache, tables = make_paged(lens, page, h_kv, d, torch.bfloat16)
        ctx = torch.tensor(lens, dtype=torch.int32)
        order = tri.decode_order(ctx)
        assert ctx[order.long()].tolist() == sorted(lens, reverse=True)
        assert tri.decode_order(ctx[:1]) is None              # batch 1: nothing to order
        q = torch.randn(len(lens), h, d).to(torch.bfloat16)
        plain = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5,
                                           num_splits=splits)
        ordered = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5,
                                             num_splits=splits, order=order)
        assert torch.equal(plain, ordered), f"seed {seed}"
        live = ctx.clamp(min=1)                      # the fused launch stores at ctx - 1
        # every row owns the block it stores into (the empty row's table above points at
        # block 0, another row's: two stores to one slot would make the order matter)
        k_cache, v_cache, tables = make_paged(live.tolist(), page, h_kv, d, torch.bfloat16)
        positions = live.long() - 1
        slots = tables[torch.arange(len(lens)), positions // page].long() * page \
            + positions % page
        qkv = torch.randn(len(lens), h + 2 * h_kv, d).to(torch.bfloat16)
        args = (positions, qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:],
                torch.randn(100, d), True)
        runs = []
        for kw in ({}, {"order": tri.decode_order(live)}):
            kc, vc = k_cache.clone(), v_cache.clone()
            runs.append((tri.rotary_decode_attention(*args, kc, vc, slots, tables, live,
                                                     d ** -0.5, num_splits=splits, **kw),
                         kc, vc))
        assert all(torch.equal(a, b) for a, b in zip(*runs)), f"seed {seed}"

    @dtype_pairs("case,splits", [(7, 2, 64, 16, [250, 1, 33, 64]), (2, 2, 32, 4, [5, 17, 1]),
                                 (7, 1, 64, 16, [40, 129])],          # a TP=2 shard
                 [None, 1, 3], ids=[lambda c: f"g{c[0]}-kv{c[1]}-d{c[2]}", str])
    def test_rotary_decode_attention(seed, poison, dtype, case, splits):
        """One launch rotates q, stores the new token's rotated K and V (in the split that
        reads that position) and attends: the same output as rotary_store_kv + decode
        attention (bit for bit in Triton; within tolerance of the torch reference), the
        same caches, and a padding row (slot -1) stores nothing. The first KV tile is
        loaded before the query is (this step's own position put in from registers)."""
        group, h_kv, d, page, lens = case
        h = group * h_kv
        k_cache, v_cache, tables = make_paged(lens, page, h_kv, d, dtype)
        ctx = torch.tensor(lens + [1], dtype=torch.int32)
        tables = torch.cat((tables, tables[:1]))                  # padding row: ctx 1
        positions = ctx.long() - 1
        last = positions.clone()
        slots = tables[torch.arange(len(ctx)), last // page].long() * page + last % page
        slots[-1] = -1
        qkv = torch.randn(len(ctx), h + 2 * h_kv, d).to(dtype)
        query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        cos_sin = torch.randn(300, d)
        args = (positions, query, key, value, cos_sin, True)
        runs = {}
        for name, fn in [("fused", lambda kc, vc: tri.rotary_decode_attention(
                              *args, kc, vc, slots, tables, ctx, d ** -0.5, num_splits=splits)),
                         ("composed", lambda kc, vc: tri.paged_decode_attention(
                              tri.rotary_store_kv(*args, kc, vc, slots), kc, vc, tables, ctx,
                              d ** -0.5, num_splits=splits)),
                         ("ref", lambda kc, vc: ref.rotary_decode_attention(
                              *args, kc, vc, slots, tables, ctx, d ** -0.5))]:
            kc, vc = k_cache.clone(), v_cache.clone()
            runs[name] = (fn(kc, vc), kc, vc)
        fused, composed, want = runs["fused"], runs["composed"], runs["ref"]
        assert torch.equal(fused[0], composed[0]), f"fused != composed (seed {seed})"
        assert torch.equal(fused[1], composed[1]) and torch.equal(fused[2], composed[2])
        assert_close(fused[0], want[0], dtype, seed, f"rotary_decode_attention {case}")
        assert torch.equal(fused[2], want[2]), f"v cache (seed {seed})"
        pad_block = int(tables[-1, 0])
        assert torch.equal(fused[1][pad_block, 0], k_cache[pad_block, 0]) or lens[0] == 1

    def test_crowded_16_bit_launches_at_head_dim_128_run_as_two_ops():
        """rotary_decode_attention runs rotary_store_kv and the plain decode where a 16-bit
        cache at head_dim >= 128 has more (sequence, KV head) pairs than
        TARGET_PROGRAMS_PER_SM a multiprocessor (the interpreter counts 4 of them); fp8,
        float32, head_dim 64 and one wave of pairs keep the fused launch."""
        from kernels import decode_attention as da
        q = torch.zeros(5, 16, 128, dtype=torch.float16)       # 5 x 8 = 40 pairs > 4 x 4
        kc = torch.zeros(2, 16, 8, 128, dtype=torch.float16)
        assert da._two_launches(q, kc)
        assert not da._two_launches(q[:2], kc)                          # 16 pairs
        assert not da._two_launches(q[..., :64], kc[..., :64])
        assert not da._two_launches(q.float(), kc.float())
        assert not da._two_launches(q, kc.to(torch.float8_e4m3fn))

    def test_wide_verify_launches_run_as_two_ops():
        """Verify rows (rows_shared) keep the fused launch up to SHARED_MAX_PAIRS (row, KV
        head) pairs, whatever the dtype and head size; past it the two ops."""
        from kernels import decode_attention as da
        kc = torch.zeros(2, 16, 2, 64, dtype=torch.float16)
        rows = da.SHARED_MAX_PAIRS // 2
        q = torch.zeros(rows + 1, 14, 64, dtype=torch.float16)
        assert not da._two_launches(q[:rows], kc, rows_shared=True)
        assert da._two_launches(q, kc, rows_shared=True)
        assert not da._two_launches(q, kc)

    # --------------------------------------------------------- rotary + kv store
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("is_neox,rot_dim,cache_dtype", [
        (True, 32, None), (False, 32, None), (True, 16, None), (False, 16, torch.float32)])
    def test_rotary_store_kv(seed, poison, dtype, is_neox, rot_dim, cache_dtype):
        t, h, h_kv, d, max_pos, page, blocks = 7, 6, 2, 32, 64, 4, 5
        positions = torch.randint(0, max_pos, (t,))
        qkv = torch.randn(t, h + 2 * h_kv, d).to(dtype)
        query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        cos_sin = torch.randn(max_pos, rot_dim)
        slots = torch.randperm(blocks * page)[:t]
        slots[torch.rand(t) < 0.3] = -1
        cdt = cache_dtype or dtype
        caches = [torch.randn(blocks, page, h_kv, d).to(cdt) for _ in range(2)]
        got_c = [c.clone() for c in caches]
        want_c = [c.clone() for c in caches]
        before = qkv.clone()
        gq = tri.rotary_store_kv(positions, query, key, value, cos_sin, is_neox,
                                 got_c[0], got_c[1], slots)
        wq = ref.rotary_store_kv(positions, query, key, value, cos_sin, is_neox,
                                 want_c[0], want_c[1], slots)
        assert torch.equal(qkv, before)
        assert_close(gq, wq, dtype, seed, "rotary_store_kv q")
        assert torch.equal(got_c[1], want_c[1]), f"v cache (seed {seed})"
        diff = (got_c[0].double() - want_c[0].double()).abs().max().item()
        assert diff <= (1e-6 if dtype == torch.float32 else 2e-3), f"k cache {diff} ({seed})"

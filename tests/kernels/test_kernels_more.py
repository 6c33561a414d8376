"""Skinny GEMM (kernels/linear.py), argmax (kernels/argmax.py) and the decode-step input
copy (kernels/step_inputs.py) vs torch under the Triton interpreter. Its tests exist only
where TRITON_INTERPRET=1: the whole run without CUDA (tests/conftest.py), or the child
pytest of tests/kernels/test_kernels.py with CUDA."""
from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    import torch

    from tests.kernels.kernel_helpers import (DTYPES, assert_close, dtype_pairs, poison,  # noqa: F401
                                              ref, seed, tri)

    # ------------------------------------------------------------------ linear
    # (M, N, K, bias, overrides): odd N/K, strided x, split-K, FMA and dot paths
    LINEAR_CASES = [
        (1, 67, 45, True, {}),
        (3, 67, 45, False, {}),
        (16, 37, 80, True, {}),
        (1, 40, 300, True, dict(block_n=16, block_k=32, split_k=4, use_dot=False)),
        (1, 40, 300, False, dict(block_n=16, block_k=32, split_k=3, use_dot=True)),
        (3, 40, 300, True, dict(block_n=16, block_k=32, split_k=4, use_dot=True)),
        (16, 33, 256, True, dict(block_n=32, block_k=64, split_k=4)),
        (5, 21, 100, True, dict(block_n=16, block_k=16, split_k=7, use_dot=True)),
        # one K step per program (the one-step plan's tiles): narrow rows, a masked K,
        # split-K; one row and several (each row's dot with the tile)
        (1, 67, 45, True, dict(block_n=2, block_k=64, split_k=1, use_dot=False, num_stages=1)),
        (1, 12, 300, False, dict(block_n=4, block_k=64, split_k=5, use_dot=False, num_stages=1)),
        (4, 67, 45, True, dict(block_n=2, block_k=64, split_k=1, use_dot=False, num_stages=1)),
        (6, 12, 300, True, dict(block_n=4, block_k=64, split_k=5, use_dot=False, num_stages=1)),
        (4, 37, 80, False, {}),
    ]

    @dtype_pairs("case", LINEAR_CASES, ids=[lambda c: f"m{c[0]}-n{c[1]}-k{c[2]}-"
                                            + "-".join(f"{k}{v}" for k, v in c[4].items())])
    def test_linear(seed, poison, dtype, case):
        m, n, k, has_bias, overrides = case
        xs = torch.randn(m, k + 3).to(dtype)[:, 2:k + 2]                 # strided rows
        w = (torch.randn(n, k) / k ** 0.5).to(dtype)
        b = torch.randn(n).to(dtype) if has_bias else None
        for _ in range(2):            # twice: the split-K counters/buffers must reset
            got = tri.linear(xs, w, b, **overrides)
            assert_close(got, ref.linear(xs, w, b), dtype, seed, f"linear {case}")
        from kernels._common import zeroed_scratch
        assert int(zeroed_scratch(xs.device, "linear_counters", 1, torch.int32)
                   .abs().sum()) == 0

    @pytest.mark.parametrize("one_step_max", [0, 1 << 22])
    def test_one_row_plans(seed, poison, monkeypatch, one_step_max):
        """Both branches of the one-row plan (kernels.linear.plan_linear at M = 1): with the
        one-step threshold below the weight (a K loop over M1 tiles) and above it (one K
        step per program), on a masked K and a split K."""
        import kernels.linear as lin
        monkeypatch.setattr(lin, "ONE_STEP_MAX_ELEMS", one_step_max)
        for n, k in ((40, 300), (24, 1100)):
            cfg = lin.plan_linear(1, n, k, 132)
            if n * k <= one_step_max:   # every program's K range is one step of the tile
                assert cfg["split_k"] == -(-k // cfg["block_k"]), cfg
                assert cfg["block_n"] * cfg["block_k"] <= lin.ONE_STEP_TILE_ELEMS, cfg
            else:
                assert cfg["block_n"] == lin.M1_BLOCK_N and cfg["num_stages"] == 4, cfg
            x = torch.randn(1, k)
            w, b = torch.randn(n, k) / k ** 0.5, torch.randn(n)
            assert_close(tri.linear(x, w, b), ref.linear(x, w, b), torch.float32, seed,
                         f"one_step_max={one_step_max} n={n} k={k}")

    def test_one_pass_tiles_fill_the_sms():
        """The tensor-core plan's one-K-pass width at up to 16 rows: 64 where N gives every
        SM a program at that width (qwen2.5's gate_up, the LM head), else 32 (qwen3's
        gate_up and qkv), so a mid-sized N never runs on fewer programs than 32-wide tiles
        give; at 17-32 rows 128 up to 128 rows an SM."""
        import kernels.linear as lin
        for m, n, k, width in ((8, 9728, 896, 64), (8, 6144, 1024, 32), (16, 4096, 1024, 32),
                               (16, 151936, 896, 64), (8, 1152, 896, 16), (32, 9728, 896, 128),
                               (32, 6144, 1024, 128), (32, 151936, 896, 64)):
            cfg = lin.plan_linear(m, n, k, 132)
            assert (cfg["use_dot"], cfg["split_k"], cfg["block_n"]) == (True, 1, width), cfg
        for n in range(16 * 132 + 1, 160 * 132, 97):
            cfg = lin.plan_linear(8, n, 896, 132)
            assert -(-n // cfg["block_n"]) >= min(132, -(-n // 32)), (n, cfg)

    def test_few_rows_plans():
        """2..ONE_STEP_MAX_M rows take the one-step plan where K fits one step without a
        split (qwen2.5's qkv and o, qwen3's qkv), and there the norm fuses; a split K
        (qwen3's o), a large weight or more rows keep the tensor-core tiles."""
        import kernels.linear as lin
        for m, n, k, one_step in ((2, 1152, 896, True), (4, 896, 896, True),
                                  (4, 4096, 1024, True), (4, 1024, 2048, False),
                                  (4, 9728, 896, False), (lin.ONE_STEP_MAX_M + 1, 1152, 896,
                                                          False)):
            cfg = lin.plan_linear(m, n, k, 132)
            assert cfg["use_dot"] is not one_step, (m, n, k, cfg)
            if one_step:
                assert cfg["split_k"] == 1 and cfg["block_k"] >= k, cfg
            assert lin._fuses_norm(m, n, k, torch.device("cpu")) is one_step, (m, n, k)

    # (M, K, N, residual, overrides): FMA (M=1) and dot paths, odd K (masked tail)
    RMS_LINEAR_CASES = [
        (1, 96, 40, True, {}),
        (3, 96, 40, False, {}),           # fused by the one-step plan (auto)
        (3, 96, 40, True, dict(fuse=True)),
        (4, 70, 24, True, {}),            # the same, 4 rows, a masked K
        (3, 96, 40, True, dict(fuse=False)),
        (16, 70, 33, True, dict(block_k=32, fuse=True)),
        (16, 70, 33, True, dict(block_k=32, fuse=False)),
        (1, 70, 24, False, dict(block_k=32, split_k=4)),     # split is ignored (needs 1)
        (1, 300, 40, True, {}),           # two K steps, the second one masked
    ]

    @dtype_pairs("case", RMS_LINEAR_CASES, ids=[lambda c: f"m{c[0]}-k{c[1]}-"
                                                f"n{c[2]}-res{int(c[3])}-{len(c[4])}"])
    def test_rms_norm_linear(seed, poison, dtype, case):
        m, k, n, with_res, overrides = case
        x = torch.randn(m, k).to(dtype)
        res = torch.randn(m, k).to(dtype) if with_res else None
        nw = (1 + 0.1 * torch.randn(k)).to(dtype)
        w = (torch.randn(n, k) / k ** 0.5).to(dtype)
        b = torch.randn(n).to(dtype)
        x0 = x.clone()
        got = tri.rms_norm_linear(x, nw, 1e-6, w, b, res, **overrides)
        want = ref.rms_norm_linear(x, nw, 1e-6, w, b, res)
        assert torch.equal(x, x0)
        if with_res:
            assert_close(got[0], want[0], dtype, seed, f"rms_norm_linear {case}")
            assert torch.equal(got[1], want[1]), f"new residual differs (seed {seed})"
        else:
            assert_close(got, want, dtype, seed, f"rms_norm_linear {case}")

    @dtype_pairs("shape", [
        (1, 100, 24, {}), (4, 64, 40, dict(block_k=32, split_k=2, fuse=True)),
        (4, 64, 40, dict(block_k=32, split_k=2)),
        (1, 160, 24, dict(block_k=32, split_k=3))], ids=[lambda c: f"m{c[0]}-k{c[1]}-"
                                             + "-".join(f"{k}{v}" for k, v in c[3].items())])
    def test_silu_mul_linear(seed, poison, dtype, shape):
        m, k, n, overrides = shape
        x = (2 * torch.randn(m, 2 * k + 5)).to(dtype)[:, 3:2 * k + 3]      # strided rows
        w = (torch.randn(n, k) / k ** 0.5).to(dtype)
        b = torch.randn(n).to(dtype)
        got = tri.silu_mul_linear(x, w, b, **overrides)
        assert_close(got, ref.silu_mul_linear(x, w, b), dtype, seed, f"silu_mul_linear {m}")

    def test_fused_linear_fallbacks(seed, poison):
        """Above the skinny limit the fused ops run rms_norm / silu_and_mul then torch."""
        x, res = torch.randn(20, 32), torch.randn(20, 32)
        nw, w = 1 + 0.1 * torch.randn(32), torch.randn(8, 32)
        got, new_res = tri.rms_norm_linear(x, nw, 1e-6, w, None, res)
        want, want_res = ref.rms_norm_linear(x, nw, 1e-6, w, None, res)
        assert_close(got, want, torch.float32, seed, "rms_norm_linear fallback")
        assert torch.equal(new_res, want_res)
        g = torch.randn(20, 64)
        assert_close(tri.silu_mul_linear(g, w), ref.silu_mul_linear(g, w), torch.float32,
                     seed, "silu_mul_linear fallback")

    def test_linear_batched_shape_and_fallback(seed, poison):
        x = torch.randn(2, 3, 24)
        w, b = torch.randn(10, 24), torch.randn(10)
        assert_close(tri.linear(x, w, b), ref.linear(x, w, b), torch.float32, seed, "3d")
        big = torch.randn(40, 24)            # above the skinny limit: torch path
        assert torch.equal(tri.linear(big, w, b), ref.linear(big, w, b))
        assert tri.linear(torch.randn(0, 24), w).shape == (0, 10)


    # ------------------------------------------------------------------ argmax
    @dtype_pairs("shape", [(1, 5000), (3, 9000), (2, 100), (16, 1025)],
                 ids=[lambda c: f"{c[0]}x{c[1]}"])
    def test_argmax(seed, poison, dtype, shape, monkeypatch):
        """torch.argmax's tokens, ties included (the first index of the maximum), with
        one split per row and with many (the last program merges); counters left zeroed."""
        from kernels import argmax as am
        from kernels._common import zeroed_scratch
        rows, vocab = shape
        monkeypatch.setattr(am, "BLOCK", 256)
        x = torch.randn(rows, vocab).to(dtype)
        x[0, [7, vocab - 1]] = 100.0                       # a tie across splits: first wins
        if rows > 1:
            x[1, vocab // 2] = x[1].max() + 1
            x[1, vocab // 2 + 1] = x[1, vocab // 2]        # a tie inside one tile
        splits, _ = am.plan_splits(rows, vocab, 4)
        for _ in range(2):
            assert torch.equal(tri.argmax(x), ref.argmax(x)), f"argmax (seed {seed})"
        assert tri.argmax(x)[0] == 7
        # 16 rows fill the 4 "SMs" of the interpreter: one split per row, over 5 tiles
        assert (splits == 1) == (rows >= 16 or vocab <= 256), splits
        assert int(zeroed_scratch(x.device, "argmax_counters", 1, torch.int32).abs().sum()) == 0
        assert tri.argmax(x[:0]).shape == (0,)

    # ------------------------------------------------------------ decode inputs
    @pytest.mark.parametrize("fed,table", [(None, True), (2, True), (3, False)])
    def test_copy_decode_inputs(seed, fed, table):
        """Every row's id, position, slot, length and table row copied; fed ids replace
        the first rows' ids; table=False leaves the device table alone."""
        from kernels.step_inputs import copy_decode_inputs
        rows, width = 3, 700                                  # two BLOCK_W steps a row
        src_tok = torch.randint(0, 1000, (3 * rows,))
        src_lens = torch.randint(1, 99, (rows,), dtype=torch.int32)
        src_table = torch.randint(0, 50, (rows + 2, width), dtype=torch.int32)[:rows]
        dst_tok = torch.full((3 * rows,), -7)
        dst_lens = torch.zeros(rows, dtype=torch.int32)
        dst_table = torch.full((rows, width), -1, dtype=torch.int32)
        fed_ids = None if fed is None else torch.arange(fed) + 5000
        copy_decode_inputs(src_tok, src_lens, src_table, dst_tok, dst_lens, dst_table,
                           fed_ids, table=table)
        want = src_tok.clone()
        if fed:
            want[:fed] = fed_ids
        assert torch.equal(dst_tok, want) and torch.equal(dst_lens, src_lens)
        assert torch.equal(dst_table, src_table if table else torch.full_like(dst_table, -1))

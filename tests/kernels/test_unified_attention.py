"""paged_unified_attention vs the torch oracle, on the CPU under the Triton interpreter.

Like tests/kernels/test_kernels.py (whose fixtures it reuses): without CUDA the run has
TRITON_INTERPRET=1 (tests/conftest.py) and these cases run in it; with CUDA one test
re-runs this file in a child pytest with TRITON_INTERPRET=1. Each case is
one mixed step: decodes and prefill chunks (fresh or over a cached prefix, crossing
block boundaries) in one launch, with padding tokens and unused sequence slots as the
CUDA-graph buffers hold them, so the launch shape is the capacity, not the mix.
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
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-4000:])
        assert proc.returncode == 0, f"{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"

    def _gpu_step(mix, cap_tokens, cap_seqs, h, h_kv, d, dtype, block_size=16, blocks=None,
                  width=None):
        """One padded mixed step on the GPU (capacities cap_tokens x cap_seqs)."""
        import torch
        news = [n for n, _ in mix]
        need = [-(-c // block_size) for _, c in mix]
        num_blocks = blocks or sum(need) + 8
        kc = torch.randn(num_blocks, block_size, h_kv, d, device="cuda").to(dtype)
        vc = torch.randn(num_blocks, block_size, h_kv, d, device="cuda").to(dtype)
        width = width or max(need) + 2
        tables = torch.randint(0, num_blocks, (cap_seqs, width), device="cuda").int()
        perm = torch.randperm(num_blocks, device="cuda").int()
        i = 0
        for b, nb in enumerate(need):
            tables[b, :nb] = perm[i:i + nb]
            i += nb
        q = torch.randn(cap_tokens, h, d, device="cuda").to(dtype)
        qsl = torch.tensor([0] + news + [0] * (cap_seqs - len(mix)), device="cuda").cumsum(0).int()
        lens = torch.tensor([c for _, c in mix] + [1] * (cap_seqs - len(mix)),
                            dtype=torch.int32, device="cuda")
        return q, kc, vc, tables, qsl, lens, sum(news)

    GPU_MIXES = [
        [(1, 600)] * 200 + [(900, 900), (1000, 1500)],      # closed-loop-like step
        [(4000, 6000), (1, 5), (1, 4000), (1, 17)],
        [(1, 1)] + [(37, 37 + 16 * k) for k in range(40)],
    ]

    @pytest.mark.gpu
    @pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
    @pytest.mark.parametrize("mix", range(len(GPU_MIXES)))
    @pytest.mark.parametrize("h,h_kv,d", [(14, 2, 64), (32, 8, 128)])
    def test_unified_gpu_matches_reference(dtype_name, mix, h, h_kv, d):
        import torch
        from kernels.unified_attention import (paged_unified_attention,
                                               unified_attention_reference)
        dtype = getattr(torch, dtype_name)
        args = _gpu_step(GPU_MIXES[mix], 8192, 256, h, h_kv, d, dtype)
        q, kc, vc, tables, qsl, lens, real = args
        out = paged_unified_attention(q, kc, vc, tables, qsl, lens, d ** -0.5)
        want = unified_attention_reference(q, kc, vc, tables, qsl, lens, d ** -0.5)
        o, w = out[:real].double(), want[:real].double()
        err = ((o - w).norm() / w.norm()).item()
        assert torch.isfinite(o).all() and err < (1.5e-2 if dtype == torch.bfloat16 else 1e-4), err

    @pytest.mark.gpu
    def test_unified_cuda_graph_replays_any_mix():
        """Capture once at a capacity (2048 tokens, 64 sequences); replay other mixes by
        filling the same buffers: each replay matches the oracle."""
        import torch
        from kernels.unified_attention import (paged_unified_attention,
                                               unified_attention_reference)
        h, h_kv, d, dtype = 14, 2, 64, torch.bfloat16
        mixes = [[(1, 50)] * 64, [(2000, 2000)], [(1, 300)] * 30 + [(500, 700), (17, 17)],
                 [(1, 3000)]]
        bufs = _gpu_step(mixes[0], 2048, 64, h, h_kv, d, dtype, blocks=4096, width=200)
        q, kc, vc, tables, qsl, lens, _ = bufs
        for _ in range(2):                                     # compile + warm up
            paged_unified_attention(q, kc, vc, tables, qsl, lens, d ** -0.5)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = paged_unified_attention(q, kc, vc, tables, qsl, lens, d ** -0.5)
        for mix in mixes:
            step = _gpu_step(mix, 2048, 64, h, h_kv, d, dtype, blocks=4096, width=200)
            for buf, new in zip(bufs[:6], step[:6]):
                buf.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            real = step[-1]
            want = unified_attention_reference(q, kc, vc, tables, qsl, lens, d ** -0.5)
            o, w = out[:real].double(), want[:real].double()
            assert ((o - w).norm() / w.norm()).item() < 1.5e-2, mix

else:
    import torch

    from kernels.unified_attention import paged_unified_attention, unified_attention_reference
    from tests.kernels.kernel_helpers import (assert_close, dtype_pairs, make_paged,  # noqa: F401
                                              poison, seed)

    # (new tokens, context) per sequence, decodes first as the engine lays them out
    MIXES = {
        "decodes+chunks": [(1, 5), (1, 16), (1, 17), (9, 9), (6, 22), (13, 13 + 32)],
        "one-chunk": [(21, 40)],
        "decodes-only": [(1, 1), (1, 33), (1, 8)],
        "boundaries": [(1, 32), (8, 16), (16, 32), (1, 15), (3, 17)],
        # one-token sequences after a chunk (a chunk's last token, a decode after a
        # verify), and an unused slot whose qsl[b + 1] == b + 1 (qsl [0, 1, 3, 3, ...])
        "one-token-after-chunk": [(1, 5), (3, 3), (1, 20), (1, 9)],
        "unused-after-chunk": [(1, 5), (2, 9)],
    }

    def _step(mix, block_size, h, h_kv, d, dtype, pad_tokens, pad_seqs):
        """Inputs of one padded step: q [T, H, D], caches, tables, qsl [S+1], lens [S]."""
        news = [n for n, _ in mix]
        ctxs = [c for _, c in mix]
        k_cache, v_cache, tables = make_paged(ctxs + [1] * pad_seqs, block_size, h_kv, d, dtype)
        real = sum(news)
        q = torch.randn(real + pad_tokens, h, d).to(dtype)
        qsl = torch.tensor([0] + news + [0] * pad_seqs, dtype=torch.int32).cumsum(0).int()
        lens = torch.tensor(ctxs + [7] * pad_seqs, dtype=torch.int32)   # unused: ignored
        return q, k_cache, v_cache, tables, qsl, lens, real

    # (h, h_kv, d, block size, block_m, decode_m): with decode_m below block_m the
    # decodes take their own tile (decode_m x 16) in the same launch as the chunks
    @dtype_pairs("mix,shape", sorted(MIXES), [(4, 2, 32, 8, 16, None), (7, 1, 16, 16, 16, None),
                                              (3, 3, 16, 4, None, None), (4, 2, 16, 8, 32, 16)],
                 ids=[str, lambda c: "h{}-kv{}-d{}-bs{}-bm{}-dm{}".format(*c)])
    def test_unified_matches_reference(seed, poison, dtype, mix, shape):
        h, h_kv, d, block_size, block_m, decode_m = shape
        q, kc, vc, tables, qsl, lens, real = _step(MIXES[mix], block_size, h, h_kv, d, dtype,
                                                   pad_tokens=5, pad_seqs=3)
        scale = d ** -0.5
        out = paged_unified_attention(q, kc, vc, tables, qsl, lens, scale, block_m=block_m,
                                      decode_m=decode_m, decode_n=decode_m and 16)
        want = unified_attention_reference(q, kc, vc, tables, qsl, lens, scale)
        assert_close(out[:real], want[:real], dtype, seed, mix)
        assert torch.isnan(out[real:]).all(), "padding rows must not be written"

    def test_more_sequence_slots_than_tokens(seed, poison):
        """A capacity of 3 tokens and 6 sequences (three decodes, three unused slots): the
        grid's spare programs read no row past the tokens."""
        mix = [(1, 4), (1, 19), (1, 2)]
        q, kc, vc, tables, qsl, lens, real = _step(mix, 8, 4, 2, 16, torch.float32, 0, 3)
        out = paged_unified_attention(q, kc, vc, tables, qsl, lens, 0.25)
        want = unified_attention_reference(q, kc, vc, tables, qsl, lens, 0.25)
        assert out.shape[0] == real == 3
        assert_close(out, want, torch.float32, seed, str(mix))

    def test_same_launch_shape_for_any_mix(seed, poison):
        """One capacity (T = 24 tokens, S = 6 sequences), three mixes: all correct, so a
        graph captured for (T, S) replays any of them."""
        for mix in ([(1, 9)] * 6, [(24, 30)], [(1, 3), (1, 4), (10, 10), (12, 40)]):
            real = sum(n for n, _ in mix)
            q, kc, vc, tables, qsl, lens, _ = _step(mix, 8, 4, 2, 16, torch.float32,
                                                    24 - real, 6 - len(mix))
            out = paged_unified_attention(q, kc, vc, tables, qsl, lens, 0.25)
            want = unified_attention_reference(q, kc, vc, tables, qsl, lens, 0.25)
            assert_close(out[:real], want[:real], torch.float32, seed, str(mix))

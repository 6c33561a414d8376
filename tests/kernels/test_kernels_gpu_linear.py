"""The skinny GEMM (kernels/linear.py, fused prologues included) and the greedy argmax
(kernels/argmax.py) on a CUDA GPU against kernels/reference.py, eagerly and replayed from
CUDA graphs."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from tests.kernels.gpu_kernel_helpers import DTYPES, check, seed, tri  # noqa: E402,F401
from kernels import reference as ref  # noqa: E402


LINEAR_SHAPES = [
    # (N, K, bias): Qwen2.5-0.5B qkv / o / gate_up / down, an odd shape, Llama-3-8B down
    (1152, 896, True), (896, 896, False), (9728, 896, False), (896, 4864, False),
    (1000, 333, True), (4096, 14336, False),
]


def linear_want(x, w, b, dtype):
    return ref.linear(x.double(), w.double(), None if b is None else b.double()).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 9, 16, 17, 32, 33])
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: f"n{s[0]}-k{s[1]}")
def test_linear(tri, seed, dtype, m, shape):
    n, k, has_bias = shape
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    check(tri.linear(x, w, b), linear_want(x, w, b, dtype), dtype, seed, f"linear m={m}")


@pytest.mark.parametrize("one_step_max", [0, 1 << 22], ids=["k-loop", "default"])
@pytest.mark.parametrize("shape", LINEAR_SHAPES[:5], ids=lambda s: f"n{s[0]}-k{s[1]}")
def test_one_step_plans_at_one_row(tri, seed, monkeypatch, one_step_max, shape):
    """Both branches of the one-row plan (0: every weight loops over K in M1 tiles; the
    default: one K step per program for the small ones) on linear, rms_norm_linear
    (+residual) and silu_mul_linear at one row, eagerly and replayed from a graph on new
    inputs."""
    import kernels.linear as lin
    monkeypatch.setattr(lin, "ONE_STEP_MAX_ELEMS", one_step_max)
    dtype, (n, k, has_bias) = torch.bfloat16, shape
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(dtype)
    x, res = (torch.empty(1, k, device="cuda", dtype=dtype) for _ in range(2))
    xs = torch.empty(1, 2 * k, device="cuda", dtype=dtype)

    def fwd(ops):
        return (ops.linear(x, w, b), *ops.rms_norm_linear(x, nw, 1e-6, w, b, res),
                ops.silu_mul_linear(xs, w, b))

    def fill():
        for t in (x, res, xs):
            t.copy_(torch.randn(t.shape, device="cuda"))

    fill()
    for got, want in zip(fwd(tri), fwd(ref)):
        check(got, want, dtype, seed, f"one-row plan {one_step_max} eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fwd(tri)
    for _ in range(2):
        fill()
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outs, fwd(ref)):
            check(got, want, dtype, seed, f"one-row plan {one_step_max} graph")


@pytest.mark.parametrize("use_dot", [True, False])
def test_linear_split_k_modes(tri, seed, use_dot):
    dtype, n, k = torch.bfloat16, 896, 4864
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    for m in ([1] if not use_dot else [1, 5, 16]):
        for split in (2, 7, 19):
            x = torch.randn(m, k, device="cuda").to(dtype)
            got = tri.linear(x, w, b, split_k=split, use_dot=use_dot, block_n=32)
            check(got, linear_want(x, w, b, dtype), dtype, seed,
                  f"linear m={m} split={split} dot={use_dot}")


def test_linear_cuda_graph_replay(tri, seed):
    """Capture the decode projections (split-K, merged in the kernel) once; replay on new x."""
    dtype = torch.bfloat16
    shapes = [(1152, 896, True), (896, 4864, False), (9728, 896, False)]
    ws = [((torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype),
           torch.randn(n, device="cuda").to(dtype) if bias else None) for n, k, bias in shapes]
    for m in (1, 4, 16):
        xs = [torch.empty(m, k, device="cuda", dtype=dtype) for _, k, _ in shapes]
        for x in xs:
            x.copy_(torch.randn_like(x, dtype=torch.float32))
        kw = {"split_k": 4}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                [tri.linear(x, w, b, **kw) for x, (w, b) in zip(xs, ws)]
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [tri.linear(x, w, b, **kw) for x, (w, b) in zip(xs, ws)]
        for _ in range(3):
            for x in xs:
                x.copy_(torch.randn_like(x, dtype=torch.float32))
            graph.replay()
            torch.cuda.synchronize()
            for x, (w, b), out in zip(xs, ws, outs):
                check(out, linear_want(x, w, b, dtype), dtype, seed,
                      f"linear graph m={m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,fuse", [(1, None), (3, None), (3, True), (8, None), (16, True), (40, None)])
@pytest.mark.parametrize("k,n", [(896, 1152), (896, 9728), (4096, 6144), (333, 100)])
def test_rms_norm_linear(tri, seed, dtype, m, fuse, k, n):
    x = torch.randn(m, k, device="cuda").to(dtype)
    res = torch.randn(m, k, device="cuda").to(dtype)
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(dtype)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    got = tri.rms_norm_linear(x, nw, 1e-6, w, None, None, fuse=fuse)
    want = ref.rms_norm_linear(x.double(), nw.double(), 1e-6, w.double()).to(dtype)
    check(got, want, dtype, seed, f"rms_norm_linear m={m}")
    got, new_res = tri.rms_norm_linear(x, nw, 1e-6, w, b, res, fuse=fuse)
    want, want_res = ref.rms_norm_linear(x, nw, 1e-6, w, b, res)
    check(got, want, dtype, seed, f"rms_norm_linear+res m={m}")
    assert torch.equal(new_res, want_res)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,fuse", [(1, None), (3, None), (8, None), (16, True), (40, None)])
@pytest.mark.parametrize("k,n", [(4864, 896), (14336, 4096), (300, 70)])
def test_silu_mul_linear(tri, seed, dtype, m, fuse, k, n):
    x = (2 * torch.randn(m, 2 * k, device="cuda")).to(dtype)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    want = ref.linear(ref.silu_and_mul(x).double(), w.double(), b.double()).to(dtype)
    check(tri.silu_mul_linear(x, w, b, fuse=fuse), want, dtype, seed, f"silu_mul_linear m={m}")


@pytest.mark.parametrize("m", [1, 4, 16])
def test_fused_decode_layer_cuda_graph_replay(tri, seed, m):
    """The decode MLP/attention projections as the model chains them, captured once and
    replayed on new inputs: rms_norm_linear (+residual) -> silu_mul_linear, and linear."""
    dtype, h, inter = torch.bfloat16, 896, 4864
    nw = (1 + 0.1 * torch.randn(h, device="cuda")).to(dtype)
    w_gu = (torch.randn(2 * inter, h, device="cuda") / h ** 0.5).to(dtype)
    w_d = (torch.randn(h, inter, device="cuda") / inter ** 0.5).to(dtype)
    w_o = (torch.randn(h, h, device="cuda") / h ** 0.5).to(dtype)
    x = torch.empty(m, h, device="cuda", dtype=dtype)
    res = torch.empty(m, h, device="cuda", dtype=dtype)

    def fwd(ops):
        o = ops.linear(x, w_o)
        gu, r = ops.rms_norm_linear(o, nw, 1e-6, w_gu, None, res)
        return ops.silu_mul_linear(gu, w_d), r

    def fill():
        x.copy_(torch.randn(m, h, device="cuda"))
        res.copy_(torch.randn(m, h, device="cuda"))

    fill()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fwd(tri)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, new_res = fwd(tri)
    for _ in range(3):
        fill()
        graph.replay()
        torch.cuda.synchronize()
        want, want_res = fwd(ref)
        check(out, want, dtype, seed, f"fused layer graph m={m}")
        check(new_res, want_res, dtype, seed, f"fused layer graph residual m={m}")


@pytest.mark.parametrize("rows", [1, 3, 16, 256])
def test_argmax_matches_torch(tri, seed, rows):
    """Greedy tokens of bf16 logits of Qwen2.5's vocabulary: torch.argmax's, ties
    included (first index), eagerly and replayed from a CUDA graph on new logits."""
    vocab = 151936
    x = torch.randn(rows, vocab, device="cuda").bfloat16()
    x[0, [11, vocab - 5]] = 50.0                       # a tie far apart: the first wins
    want = x.argmax(-1)
    assert torch.equal(tri.argmax(x), want), f"seed {seed}"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri.argmax(x)
    x.copy_(torch.randn(rows, vocab, device="cuda").bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x.argmax(-1)), f"graph (seed {seed})"

"""Triton kernels vs kernels/reference.py on a CUDA GPU, bf16 and fp32, realistic shapes,
plus decode attention captured in a CUDA graph and replayed on new inputs."""
from __future__ import annotations

import os
import random

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from kernels import reference as ref  # noqa: E402

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


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_cache(tri, seed, dtype):
    t, h_kv, d, bs, nb = 3000, 8, 128, 16, 400
    qkv = torch.randn(t, 32 + 2 * h_kv, d, device="cuda").to(dtype)
    key, value = qkv[:, 32:32 + h_kv], qkv[:, 32 + h_kv:]
    slots = torch.randperm(nb * bs, device="cuda")[:t]
    slots[torch.rand(t, device="cuda") < 0.1] = -1
    got = [torch.randn(nb, bs, h_kv, d, device="cuda").to(dtype) for _ in range(2)]
    want = [c.clone() for c in got]
    tri.store_kv_cache(key, value, got[0], got[1], slots)
    ref.store_kv_cache(key, value, want[0], want[1], slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


DECODE_SHAPES = [
    # (batch, heads, kv heads, head_dim, block_size, max context)
    (64, 14, 2, 64, 16, 3000),      # Qwen2.5-0.5B
    (8, 32, 8, 128, 16, 5000),      # Llama-3-8B
    (5, 16, 16, 128, 32, 2000),     # MHA (group 1)
    (3, 12, 4, 64, 16, 20000),      # long context, many splits
    (4, 8, 2, 256, 8, 900),         # head_dim 256, block 8
    (6, 4, 1, 32, 128, 1500),       # head_dim 32, block 128
]


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_paged_decode_attention(tri, seed, dtype, shape, merge):
    b, h, h_kv, d, bs, max_ctx = shape
    lens = torch.randint(1, max_ctx, (b,)).tolist()
    lens[0] = max_ctx
    lens[-1] = 1
    k_cache, v_cache, tables = paged(lens, bs, h_kv, d, dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, h, d, device="cuda").to(dtype)
    out = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5,
                                     merge=merge)
    want = ref.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
    check(out, want, dtype, seed, f"decode {shape} merge={merge}")


EXTEND_SHAPES = [
    # (heads, kv heads, head_dim, block_size, [(context, new tokens), ...])
    (14, 2, 64, 16, [(1500, 700), (300, 300), (2000, 1), (77, 13)]),
    (32, 8, 128, 16, [(1024, 512), (600, 129), (513, 513)]),
    (8, 8, 64, 32, [(900, 250), (64, 64)]),
    (8, 2, 256, 8, [(300, 100), (45, 45)]),
    (4, 1, 32, 128, [(700, 300), (129, 2)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EXTEND_SHAPES, ids=lambda s: f"h{s[0]}-kv{s[1]}-d{s[2]}")
def test_paged_extend_attention(tri, seed, dtype, shape):
    h, h_kv, d, bs, seqs = shape
    lens = [c for c, _ in seqs]
    n_new = [n for _, n in seqs]
    k_cache, v_cache, tables = paged(lens, bs, h_kv, d, dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0] + n_new, device="cuda").cumsum(0).int()
    q = torch.randn(sum(n_new), h, d, device="cuda").to(dtype)
    out = tri.paged_extend_attention(q, k_cache, v_cache, tables, cu, ctx, max(n_new),
                                     d ** -0.5)
    want = ref.paged_extend_attention(q, k_cache, v_cache, tables, cu, ctx, max(n_new),
                                      d ** -0.5)
    check(out, want, dtype, seed, f"extend {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [896, 4096])
def test_rms_norm(tri, seed, dtype, hidden):
    x = torch.randn(2048, hidden, device="cuda").to(dtype)
    res = torch.randn(2048, hidden, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(dtype)
    check(tri.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), dtype, seed, "rms_norm")
    got, want = tri.rms_norm(x, w, 1e-6, res), ref.rms_norm(x, w, 1e-6, res)
    check(got[0], want[0], dtype, seed, "rms_norm+res")
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox,rot_dim", [(True, 128), (False, 128), (True, 64)])
def test_rotary_embedding(tri, seed, dtype, is_neox, rot_dim):
    t, h, h_kv, d = 1000, 32, 8, 128
    positions = torch.randint(0, 4096, (t,), device="cuda")
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, device="cuda").float() / rot_dim))
    freqs = torch.outer(torch.arange(4096, device="cuda").float(), inv)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    qkv = torch.randn(t, h + 2 * h_kv, d, device="cuda").to(dtype)
    query, key = qkv[:, :h], qkv[:, h:h + h_kv]
    gq, gk = tri.rotary_embedding(positions, query, key, cos_sin, is_neox)
    wq, wk = ref.rotary_embedding(positions, query, key, cos_sin, is_neox)
    check(gq, wq, dtype, seed, "rope q")
    check(gk, wk, dtype, seed, "rope k")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(tri, seed, dtype):
    x = (2 * torch.randn(1500, 2 * 4864, device="cuda")).to(dtype)
    check(tri.silu_and_mul(x), ref.silu_and_mul(x), dtype, seed, "silu_and_mul")


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 32])
def test_decode_cuda_graph_replay(tri, seed, dtype, batch):
    """Capture once with fixed buffers; replay with new lengths and tables (incl. 0)."""
    h, h_kv, d, bs, max_blocks = 14, 2, 64, 16, 256           # up to 4096 tokens
    num_blocks = batch * max_blocks + 8
    k_cache = torch.randn(num_blocks, bs, h_kv, d, device="cuda").to(dtype)
    v_cache = torch.randn(num_blocks, bs, h_kv, d, device="cuda").to(dtype)
    q = torch.empty(batch, h, d, device="cuda", dtype=dtype)
    tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda")
    ctx = torch.zeros(batch, dtype=torch.int32, device="cuda")

    def fill(max_len):
        lens = torch.randint(1, max_len + 1, (batch,), device="cuda").int()
        if batch > 1:
            lens[-1] = 0                                       # a padded graph slot
        ctx.copy_(lens)
        tables.copy_(torch.randperm(num_blocks, device="cuda")[:batch * max_blocks]
                     .view(batch, max_blocks).int())
        q.copy_(torch.randn(batch, h, d, device="cuda").to(dtype))

    fill(100)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):                                     # compile + warm up
            tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
    for max_len in [100, max_blocks * bs, 17, 2500]:
        fill(max_len)
        graph.replay()
        torch.cuda.synchronize()
        want = ref.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
        check(out, want, dtype, seed, f"graph replay max_len={max_len}")
        if batch > 1:
            assert torch.equal(out[-1], torch.zeros_like(out[-1]))


LINEAR_SHAPES = [
    # (N, K, bias): Qwen2.5-0.5B qkv / o / gate_up / down, an odd shape, Llama-3-8B down
    (1152, 896, True), (896, 896, False), (9728, 896, False), (896, 4864, False),
    (1000, 333, True), (4096, 14336, False),
]


def linear_want(x, w, b, dtype):
    return ref.linear(x.double(), w.double(), None if b is None else b.double()).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 32, 33])
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: f"n{s[0]}-k{s[1]}")
def test_linear(tri, seed, dtype, m, shape):
    n, k, has_bias = shape
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    check(tri.linear(x, w, b), linear_want(x, w, b, dtype), dtype, seed, f"linear m={m}")


@pytest.mark.parametrize("reduce", [1, 2])
@pytest.mark.parametrize("use_dot", [True, False])
def test_linear_split_k_modes(tri, seed, reduce, use_dot):
    dtype, n, k = torch.bfloat16, 896, 4864
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    for m in ([1] if not use_dot else [1, 5, 16]):
        for split in (2, 7, 19):
            x = torch.randn(m, k, device="cuda").to(dtype)
            got = tri.linear(x, w, b, split_k=split, reduce=reduce, use_dot=use_dot,
                             block_n=32)
            check(got, linear_want(x, w, b, dtype), dtype, seed,
                  f"linear m={m} split={split} reduce={reduce} dot={use_dot}")


@pytest.mark.parametrize("reduce", [1, 2])
def test_linear_cuda_graph_replay(tri, seed, reduce):
    """Capture the decode projections (split-K, merged in the kernel) once; replay on new x."""
    dtype = torch.bfloat16
    shapes = [(1152, 896, True), (896, 4864, False), (9728, 896, False)]
    ws = [((torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype),
           torch.randn(n, device="cuda").to(dtype) if bias else None) for n, k, bias in shapes]
    for m in (1, 4, 16):
        xs = [torch.empty(m, k, device="cuda", dtype=dtype) for _, k, _ in shapes]
        for x in xs:
            x.copy_(torch.randn_like(x, dtype=torch.float32))
        kw = {"reduce": reduce, "split_k": 4}
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
                      f"linear graph m={m} reduce={reduce}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,fuse", [(1, None), (3, None), (3, True), (16, True), (40, None)])
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
@pytest.mark.parametrize("m,fuse", [(1, None), (3, None), (16, True), (40, None)])
@pytest.mark.parametrize("k,n", [(4864, 896), (14336, 4096), (300, 70)])
def test_silu_mul_linear(tri, seed, dtype, m, fuse, k, n):
    x = (2 * torch.randn(m, 2 * k, device="cuda")).to(dtype)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    want = ref.linear(ref.silu_and_mul(x).double(), w.double(), b.double()).to(dtype)
    check(tri.silu_mul_linear(x, w, b, fuse=fuse), want, dtype, seed, f"silu_mul_linear m={m}")


@pytest.mark.parametrize("m", [1, 16])
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox,rot_dim", [(True, 128), (False, 128), (True, 64)])
def test_rotary_store_kv(tri, seed, dtype, is_neox, rot_dim):
    t, h, h_kv, d, bs, nb = 1000, 32, 8, 128, 16, 100
    positions = torch.randint(0, 4096, (t,), device="cuda")
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, device="cuda").float() / rot_dim))
    freqs = torch.outer(torch.arange(4096, device="cuda").float(), inv)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    qkv = torch.randn(t, h + 2 * h_kv, d, device="cuda").to(dtype)
    query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    slots = torch.randperm(nb * bs, device="cuda")[:t]
    slots[torch.rand(t, device="cuda") < 0.1] = -1
    caches = [torch.randn(nb, bs, h_kv, d, device="cuda").to(dtype) for _ in range(2)]
    got, want = [c.clone() for c in caches], [c.clone() for c in caches]
    gq = tri.rotary_store_kv(positions, query, key, value, cos_sin, is_neox, *got, slots)
    wq = ref.rotary_store_kv(positions, query, key, value, cos_sin, is_neox, *want, slots)
    check(gq, wq, dtype, seed, "rotary_store_kv q")
    check(got[0], want[0], dtype, seed, "rotary_store_kv k cache")
    assert torch.equal(got[1], want[1])


def test_rotary_store_kv_cuda_graph_replay(tri, seed):
    """Capture at a padded decode shape (slot -1 rows); replay with new positions/slots."""
    dtype, t, h, h_kv, d, bs, nb = torch.bfloat16, 16, 14, 2, 64, 16, 64
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    freqs = torch.outer(torch.arange(2048, device="cuda").float(), inv)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    qkv = torch.empty(t, h + 2 * h_kv, d, device="cuda", dtype=dtype)
    query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    positions = torch.zeros(t, dtype=torch.int64, device="cuda")
    slots = torch.full((t,), -1, dtype=torch.int64, device="cuda")
    caches = [torch.randn(nb, bs, h_kv, d, device="cuda").to(dtype) for _ in range(2)]

    def fill():
        qkv.copy_(torch.randn(qkv.shape, device="cuda"))
        positions.copy_(torch.randint(0, 2048, (t,), device="cuda"))
        new = torch.randperm(nb * bs, device="cuda")[:t]
        new[torch.rand(t, device="cuda") < 0.3] = -1
        slots.copy_(new)

    fill()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tri.rotary_store_kv(positions, query, key, value, cos_sin, True, *caches, slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out = tri.rotary_store_kv(positions, query, key, value, cos_sin, True, *caches, slots)
    for _ in range(3):
        fill()
        want = [c.clone() for c in caches]
        wq = ref.rotary_store_kv(positions, query, key, value, cos_sin, True, *want, slots)
        graph.replay()
        torch.cuda.synchronize()
        check(q_out, wq, dtype, seed, "rotary_store_kv graph q")
        assert torch.equal(caches[1], want[1])
        check(caches[0], want[0], dtype, seed, "rotary_store_kv graph k")


@pytest.mark.parametrize("batch", [1, 16, 256])
def test_rotary_decode_attention_matches_two_ops(tri, seed, batch):
    """The fused launch on real parallel programs (the split that reads the new position
    is the one that stored it): bit-equal to rotary_store_kv + decode attention, caches
    included, with the engine's shapes and a table as wide as max_model_len 8192."""
    h, h_kv, d, bs, width = 14, 2, 64, 16, 512
    lens = torch.randint(1, 3000, (batch,))
    need = [(int(n) + bs - 1) // bs for n in lens]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks)
    tables = torch.zeros(batch, width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[at:at + n].int()
        at += n
    tables, ctx = tables.cuda(), lens.int().cuda()
    pos = (lens - 1).cuda()
    slots = tables[torch.arange(batch, device="cuda"), pos // bs].long() * bs + pos % bs
    qkv = torch.randn(batch, h + 2 * h_kv, d, device="cuda").bfloat16()
    q, k, v = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    cos_sin = torch.randn(4096, d, device="cuda")
    caches = [torch.randn(num_blocks, bs, h_kv, d, device="cuda").bfloat16() for _ in range(2)]
    a = [c.clone() for c in caches]
    b_ = [c.clone() for c in caches]
    fused = tri.rotary_decode_attention(pos, q, k, v, cos_sin, True, a[0], a[1], slots,
                                        tables, ctx, d ** -0.5)
    q_rot = tri.rotary_store_kv(pos, q, k, v, cos_sin, True, b_[0], b_[1], slots)
    composed = tri.paged_decode_attention(q_rot, b_[0], b_[1], tables, ctx, d ** -0.5)
    torch.cuda.synchronize()
    assert torch.equal(a[0], b_[0]) and torch.equal(a[1], b_[1]), f"caches (seed {seed})"
    assert torch.equal(fused, composed), f"outputs (seed {seed})"


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

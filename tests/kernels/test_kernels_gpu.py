"""Triton kernels vs kernels/reference.py on a CUDA GPU, bf16 and fp32, realistic shapes,
plus decode attention captured in a CUDA graph and replayed on new inputs."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from tests.kernels.gpu_kernel_helpers import DTYPES, check, paged, seed, tri  # noqa: E402,F401
from kernels import reference as ref  # noqa: E402


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_paged_decode_attention(tri, seed, dtype, shape):
    b, h, h_kv, d, bs, max_ctx = shape
    lens = torch.randint(1, max_ctx, (b,)).tolist()
    lens[0] = max_ctx
    lens[-1] = 1
    k_cache, v_cache, tables = paged(lens, bs, h_kv, d, dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, h, d, device="cuda").to(dtype)
    out = tri.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
    want = ref.paged_decode_attention(q, k_cache, v_cache, tables, ctx, d ** -0.5)
    check(out, want, dtype, seed, f"decode {shape}")


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
@pytest.mark.parametrize("tokens", [1, 256, 8195])
def test_rms_norm_per_head_over_a_qkv_split(tri, seed, dtype, tokens):
    """qwen3-0.6b's q/k norms read from the qkv output where they lie (16 + 8 + 8 heads
    of 128)."""
    qkv = torch.randn(tokens, 32 * 128, device="cuda").to(dtype)
    q, k, _ = qkv.split([16 * 128, 8 * 128, 8 * 128], dim=-1)
    w = (1 + 0.1 * torch.randn(128, device="cuda")).to(dtype)
    for x in (q.reshape(tokens, 16, 128), k.reshape(tokens, 8, 128)):
        check(tri.rms_norm(x, w, 1e-6), ref.rms_norm(x.contiguous(), w, 1e-6), dtype, seed,
              f"rms_norm per head {tuple(x.shape)}")
    qk = qkv[:, :24 * 128].view(tokens, 24, 128)
    rows = 1 + 0.1 * torch.randn(24, 128, device="cuda")
    check(tri.rms_norm(qk, rows, 1e-6), ref.rms_norm(qk.contiguous(), rows, 1e-6), dtype, seed,
          "rms_norm, a weight row per head")


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


def _wide_tables(lens: torch.Tensor, bs: int, width: int = 512) -> tuple[torch.Tensor, int]:
    """Block tables (host) as wide as max_model_len 8192 at pages of 16, each sequence's
    blocks a random disjoint set of the pool; and the pool's size (4 blocks spare)."""
    need = [(int(n) + bs - 1) // bs for n in lens]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks)
    tables = torch.zeros(len(need), width, dtype=torch.int32)
    at = 0
    for r, n in enumerate(need):
        tables[r, :n] = perm[at:at + n].int()
        at += n
    return tables, num_blocks


@pytest.mark.parametrize("requests,k", [(1, 3), (8, 3), (4, 6), (16, 3)])
def test_rotary_decode_attention_shared_rows_match_two_ops(tri, seed, requests, k):
    """A verify step's rows (1 + k a request, rows_shared) in the one fused launch, on
    real parallel programs: bit-equal to rotary_store_kv + decode attention, caches
    included (bf16, qwen2.5-0.5b's heads, a table as wide as max_model_len 8192; 16
    requests of 1 + 3 rows pass SHARED_MAX_PAIRS and take the two ops)."""
    h, h_kv, d, bs = 14, 2, 64, 16
    lens = torch.randint(k + 2, 3000, (requests,))
    tables, num_blocks = _wide_tables(lens, bs)
    seq = torch.arange(requests).repeat_interleave(k + 1)
    pos = torch.cat([torch.arange(int(n) - k - 1, int(n)) for n in lens])
    row_tables = tables[seq].contiguous().cuda()
    slots = (tables[seq, pos // bs].long() * bs + pos % bs).cuda()
    pos, ctx = pos.cuda(), (pos + 1).int().cuda()
    t = seq.shape[0]
    qkv = torch.randn(t, h + 2 * h_kv, d, device="cuda").bfloat16()
    q, k_, v = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    cos_sin = torch.randn(4096, d, device="cuda")
    caches = [torch.randn(num_blocks, bs, h_kv, d, device="cuda").bfloat16()
              for _ in range(2)]
    a = [c.clone() for c in caches]
    b_ = [c.clone() for c in caches]
    fused = tri.rotary_decode_attention(pos, q, k_, v, cos_sin, True, a[0], a[1], slots,
                                        row_tables, ctx, d ** -0.5, rows_shared=True)
    q_rot = tri.rotary_store_kv(pos, q, k_, v, cos_sin, True, b_[0], b_[1], slots)
    composed = tri.paged_decode_attention(q_rot, b_[0], b_[1], row_tables, ctx, d ** -0.5)
    torch.cuda.synchronize()
    assert torch.equal(a[0], b_[0]) and torch.equal(a[1], b_[1]), f"caches (seed {seed})"
    assert torch.equal(fused, composed), f"outputs (seed {seed})"


@pytest.mark.parametrize("batch", [1, 16, 256])
def test_rotary_decode_attention_matches_two_ops(tri, seed, batch):
    """The fused launch on real parallel programs (the split that reads the new position
    is the one that stored it): bit-equal to rotary_store_kv + decode attention, caches
    included, with the engine's shapes and a table as wide as max_model_len 8192."""
    h, h_kv, d, bs = 14, 2, 64, 16
    lens = torch.randint(1, 3000, (batch,))
    tables, num_blocks = _wide_tables(lens, bs)
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

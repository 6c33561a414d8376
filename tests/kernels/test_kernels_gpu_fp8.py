"""FP8 KV caches on the GPU: each Triton kernel that stores or reads the cache against
kernels/reference.py at engine shapes with random values (the interpreter tests,
tests/kernels/test_fp8_kv.py, store grid values only: the interpreter's fp8 rounding is
not the hardware's), the fused rotary decode bit-equal to its two ops (a verify step's
rows of one request too), and a CUDA graph that reads scales changed in place after
capture (calculate_kv_scales)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from tests.kernels.gpu_kernel_helpers import DTYPES, check, paged, seed, tri  # noqa: E402,F401
from kernels import reference as ref  # noqa: E402
from kernels.kv_quant import FP8_DTYPE, quantize  # noqa: E402

F8 = FP8_DTYPE


def _scales(heads):
    return torch.rand(heads, device="cuda") * 0.5 + 0.01


def fp8_paged(lens, bs, h_kv, d):
    """Caches quantized by torch (values ~N(0, 2), per-head scales) and the tables."""
    k, v, tables = paged(lens, bs, h_kv, d, torch.float32)
    ks, vs = _scales(h_kv), _scales(h_kv)
    return quantize(2 * k, F8, ks), quantize(2 * v, F8, vs), tables, ks, vs


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def code_steps(a, b) -> torch.Tensor:
    """How many e4m3 codes apart two fp8 tensors are (same sign: adjacent codes are
    adjacent integers)."""
    return (a.view(torch.uint8).int() - b.view(torch.uint8).int()).abs()


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_cache_fp8(tri, seed, dtype):
    """Random values, per-head scales, some beyond ±448·scale: byte-equal to torch's
    rounding (round to nearest even after the saturating clamp)."""
    t, h_kv, d, bs, nb = 3000, 8, 128, 16, 400
    qkv = (torch.randn(t, 32 + 2 * h_kv, d, device="cuda") * 3).to(dtype)
    key, value = qkv[:, 32:32 + h_kv], qkv[:, 32 + h_kv:]
    ks, vs = _scales(h_kv) / 100, _scales(h_kv)          # some keys saturate
    slots = torch.randperm(nb * bs, device="cuda")[:t]
    slots[torch.rand(t, device="cuda") < 0.1] = -1
    got = [torch.zeros(nb, bs, h_kv, d, device="cuda", dtype=F8) for _ in range(2)]
    want = [c.clone() for c in got]
    tri.store_kv_cache(key, value, *got, slots, k_scale=ks, v_scale=vs)
    ref.store_kv_cache(key, value, *want, slots, k_scale=ks, v_scale=vs)
    assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1]), f"seed {seed}"
    assert not torch.isnan(got[0].float()).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_store_kv_fp8(tri, seed, dtype):
    """The rotation's float32 rounding may differ from torch's in the last bit, which
    can move a code by one at a rounding tie: never more, and rarely."""
    t, h, h_kv, d, bs, nb = 1000, 32, 8, 128, 16, 100
    positions = torch.randint(0, 4096, (t,), device="cuda")
    qkv = (torch.randn(t, h + 2 * h_kv, d, device="cuda") * 3).to(dtype)
    query, key, value = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    cos_sin = torch.randn(4096, d, device="cuda")
    ks, vs = _scales(h_kv), _scales(h_kv)
    slots = torch.randperm(nb * bs, device="cuda")[:t]
    runs = []
    for ops in (tri, ref):
        kc = torch.zeros(nb, bs, h_kv, d, device="cuda", dtype=F8)
        vc = torch.zeros_like(kc)
        q = ops.rotary_store_kv(positions, query, key, value, cos_sin, True, kc, vc, slots,
                                k_scale=ks, v_scale=vs)
        runs.append((q, kc, vc))
    (q, kc, vc), (q_ref, kc_ref, vc_ref) = runs
    check(q, q_ref, dtype, seed, "rotated query")
    steps = code_steps(kc, kc_ref)
    assert steps.max() <= 1 and (steps > 0).float().mean() < 1e-3, f"seed {seed}"
    assert same_bytes(vc, vc_ref)


# the last: qwen3-0.6b at batch 256, a crowded launch (decode_attention.CROWDED_FP8)
DECODE_SHAPES = [(64, 14, 2, 64, 16, 3000), (8, 32, 8, 128, 16, 5000),
                 (3, 12, 4, 64, 16, 20000), (6, 4, 1, 32, 128, 1500),
                 (256, 16, 8, 128, 16, 700)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_decode_attention_fp8(tri, seed, dtype, shape):
    b, h, h_kv, d, bs, max_ctx = shape
    lens = torch.randint(1, max_ctx, (b,)).tolist()
    lens[0], lens[-1] = max_ctx, 1
    kc, vc, tables, ks, vs = fp8_paged(lens, bs, h_kv, d)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, h, d, device="cuda").to(dtype)
    sc = dict(k_scale=ks, v_scale=vs)
    out = tri.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, **sc)
    check(out, ref.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, **sc), dtype,
          seed, f"decode fp8 {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_and_unified_attention_fp8(tri, seed, dtype):
    from kernels.unified_attention import paged_unified_attention, unified_attention_reference
    h, h_kv, d, bs = 14, 2, 64, 16
    seqs = [(1500, 700), (300, 300), (2000, 1), (77, 13)]
    lens, news = [c for c, _ in seqs], [n for _, n in seqs]
    kc, vc, tables, ks, vs = fp8_paged(lens, bs, h_kv, d)
    sc = dict(k_scale=ks, v_scale=vs)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0] + news, device="cuda").cumsum(0).int()
    q = torch.randn(sum(news), h, d, device="cuda").to(dtype)
    args = (q, kc, vc, tables, cu, ctx, max(news), d ** -0.5)
    check(tri.paged_extend_attention(*args, **sc), ref.paged_extend_attention(*args, **sc),
          dtype, seed, "extend fp8")
    out = paged_unified_attention(q, kc, vc, tables, cu, ctx, d ** -0.5, **sc)
    check(out, unified_attention_reference(q, kc, vc, tables, cu, ctx, d ** -0.5, **sc),
          dtype, seed, "unified fp8")


@pytest.mark.parametrize("batch,h,h_kv,d", [(1, 14, 2, 64), (16, 14, 2, 64), (256, 14, 2, 64),
                                            (256, 16, 8, 128)])
def test_rotary_decode_attention_fp8_fused_equals_two_ops(tri, seed, batch, h, h_kv, d):
    bs = 16
    lens = torch.randint(1, 2000, (batch,)).tolist()
    kc0, vc0, tables, ks, vs = fp8_paged(lens, bs, h_kv, d)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    positions = ctx.long() - 1
    slots = tables[torch.arange(batch, device="cuda"), positions // bs].long() * bs \
        + positions % bs
    qkv = torch.randn(batch, h + 2 * h_kv, d, device="cuda").to(torch.bfloat16)
    args = (positions, qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:],
            torch.randn(4096, d, device="cuda"), True)
    sc = dict(k_scale=ks, v_scale=vs)
    kc, vc = kc0.clone(), vc0.clone()
    fused = tri.rotary_decode_attention(*args, kc, vc, slots, tables, ctx, d ** -0.5, **sc)
    kc2, vc2 = kc0.clone(), vc0.clone()
    q = tri.rotary_store_kv(*args, kc2, vc2, slots, **sc)
    composed = tri.paged_decode_attention(q, kc2, vc2, tables, ctx, d ** -0.5, **sc)
    assert torch.equal(fused, composed), f"seed {seed}"
    assert same_bytes(kc, kc2) and same_bytes(vc, vc2)


@pytest.mark.parametrize("requests,k,h,h_kv,d", [(1, 3, 14, 2, 64), (8, 3, 14, 2, 64),
                                                  (16, 3, 14, 2, 64), (2, 3, 16, 8, 128),
                                                  (1, 5, 16, 8, 128)])
def test_rotary_decode_attention_fp8_shared_rows_equal_two_ops(tri, seed, requests, k, h,
                                                               h_kv, d):
    """A verify step's rows (1 + k a request, rows_shared) in one launch, where the rows
    of a request run concurrently: bit-equal to storing every row first, caches too (8
    requests of 1 + 3 rows at 2 KV heads fill SHARED_MAX_PAIRS, as 2 do at 8; 16 take the
    two ops)."""
    bs = 16
    lens = torch.randint(k + 2, 2000, (requests,)).tolist()
    kc0, vc0, tables, ks, vs = fp8_paged(lens, bs, h_kv, d)
    seq = torch.arange(requests, device="cuda").repeat_interleave(k + 1)
    positions = torch.cat([torch.arange(n - k - 1, n) for n in lens]).cuda()
    ctx = (positions + 1).to(torch.int32)
    row_tables = tables[seq].contiguous()
    slots = tables[seq, positions // bs].long() * bs + positions % bs
    t = seq.shape[0]
    qkv = torch.randn(t, h + 2 * h_kv, d, device="cuda").to(torch.bfloat16)
    args = (positions, qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:],
            torch.randn(4096, d, device="cuda"), True)
    sc = dict(k_scale=ks, v_scale=vs)
    kc, vc = kc0.clone(), vc0.clone()
    fused = tri.rotary_decode_attention(*args, kc, vc, slots, row_tables, ctx, d ** -0.5,
                                        rows_shared=True, **sc)
    kc2, vc2 = kc0.clone(), vc0.clone()
    q = tri.rotary_store_kv(*args, kc2, vc2, slots, **sc)
    composed = tri.paged_decode_attention(q, kc2, vc2, row_tables, ctx, d ** -0.5, **sc)
    assert torch.equal(fused, composed), f"seed {seed}"
    assert same_bytes(kc, kc2) and same_bytes(vc, vc2)


def test_decode_graph_reads_scales_changed_after_capture(tri, seed):
    """The scales are read through their pointers: a graph captured with unit scales
    replays with the calibrated ones written in place (calculate_kv_scales)."""
    b, h, h_kv, d, bs = 8, 14, 2, 64, 16
    lens = [700] * b
    kc, vc, tables, _, _ = fp8_paged(lens, bs, h_kv, d)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, h, d, device="cuda").to(torch.bfloat16)
    ks, vs = torch.ones(h_kv, device="cuda"), torch.ones(h_kv, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            tri.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, k_scale=ks,
                                       v_scale=vs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, k_scale=ks,
                                         v_scale=vs)
    ks.copy_(_scales(h_kv))
    vs.copy_(_scales(h_kv))
    graph.replay()
    torch.cuda.synchronize()
    want = ref.paged_decode_attention(q, kc, vc, tables, ctx, d ** -0.5, k_scale=ks,
                                      v_scale=vs)
    check(out, want, torch.bfloat16, seed, "graph with new scales")

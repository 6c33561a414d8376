"""Microbenchmark the Triton paged attention kernels on a CUDA GPU.

  python scripts/bench_kernels.py results.json [--sweep] [--quick]
      [--heads 14 --kv-heads 2 --head-dim 64]

Shape: Qwen2.5-0.5B attention (14 query heads, 2 KV heads, head_dim 64), bf16, block 16.
Decode: batch 1/16/64/256 x context 512/2048/8192, one query token per sequence, random
(fragmented) block tables over one shared cache. Extend: the same grid with a chunk of
min(context, 512) new tokens per sequence on top of a prefix, plus two whole-prompt
prefills. Times are triton.testing.do_bench medians (L2 flushed before each call); decode
is also timed as a CUDA-graph replay. Bandwidth counts K/V read once plus q and out, and
is compared with a device-to-device copy measured here (bytes read + written).
--sweep also times tile/warp/stage/split variants at a few points; --quick trims the grid
(batch 1/64 x context 512/8192) and the sweep points.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kernels import reference as ref  # noqa: E402
from kernels.decode_attention import paged_decode_attention  # noqa: E402
from kernels.extend_attention import paged_extend_attention  # noqa: E402

H, H_KV, D, BS = 14, 2, 64, 16
DTYPE = torch.bfloat16
BATCHES = [1, 16, 64, 256]
CONTEXTS = [512, 2048, 8192]
CHUNK = 512
REF_BATCHES, REF_CTX = [1, 16], 512           # torch reference contrast points
DEVICE = "cuda"
QUICK = False
FAST = False             # shorter timing while sweeping
SMOKE = False            # --cpu-smoke: tiny grid on CPU under TRITON_INTERPRET=1


def bench(fn, warmup=25, rep=100):
    if FAST:
        warmup, rep = 5, 30
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_ceiling() -> float:
    n = 1 << (20 if SMOKE else 30)                            # 1 GiB each way
    src = torch.randn(n // 4, device=DEVICE)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * n / (ms * 1e-3) / 1e12


class Pool:
    """One shared paged cache big enough for the largest point; tables are random."""

    def __init__(self, max_tokens: int):
        self.num_blocks = max_tokens // BS + 64
        self.k = torch.randn(self.num_blocks, BS, H_KV, D, device=DEVICE, dtype=DTYPE)
        self.v = torch.randn(self.num_blocks, BS, H_KV, D, device=DEVICE, dtype=DTYPE)

    def tables(self, batch: int, ctx: int) -> torch.Tensor:
        per = triton.cdiv(ctx, BS)
        ids = torch.randperm(self.num_blocks, device=DEVICE)[:batch * per]
        return ids.view(batch, per).int()


def kv_bytes(batch, ctx):
    return batch * ctx * H_KV * D * 2 * DTYPE.itemsize


def decode_point(pool, batch, ctx, ceiling, graph=True, **kw):
    tables = pool.tables(batch, ctx)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    q = torch.randn(batch, H, D, device=DEVICE, dtype=DTYPE)
    fn = lambda: paged_decode_attention(q, pool.k, pool.v, tables, lens, D ** -0.5, **kw)  # noqa: E731
    ms = bench(fn)
    nbytes = kv_bytes(batch, ctx) + 2 * q.numel() * q.element_size()
    row = {"batch": batch, "context": ctx, "ms": ms, "TBps": nbytes / (ms * 1e-3) / 1e12}
    row["pct_copy"] = 100 * row["TBps"] / ceiling
    if graph and not SMOKE:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        row["graph_ms"] = bench(g.replay)
        row["graph_TBps"] = nbytes / (row["graph_ms"] * 1e-3) / 1e12
    return row


def extend_inputs(pool, batch, ctx, n_new):
    tables = pool.tables(batch, ctx)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    cu = torch.arange(0, batch + 1, device=DEVICE, dtype=torch.int32) * n_new
    q = torch.randn(batch * n_new, H, D, device=DEVICE, dtype=DTYPE)
    return q, tables, cu, lens


def extend_point(pool, batch, ctx, n_new, ceiling, **kw):
    q, tables, cu, lens = extend_inputs(pool, batch, ctx, n_new)
    ms = bench(lambda: paged_extend_attention(q, pool.k, pool.v, tables, cu, lens, n_new,
                                              D ** -0.5, **kw))
    prefix = ctx - n_new
    flops = 4 * H * D * batch * (n_new * prefix + n_new * (n_new + 1) / 2)
    nbytes = kv_bytes(batch, ctx) + 2 * q.numel() * q.element_size()
    tbps = nbytes / (ms * 1e-3) / 1e12
    return {"batch": batch, "context": ctx, "new_tokens": n_new, "ms": ms,
            "TFLOPs": flops / (ms * 1e-3) / 1e12, "TBps": tbps, "pct_copy": 100 * tbps / ceiling}


def reference_points(pool):
    rows = []
    ctx = REF_CTX
    for batch in REF_BATCHES:
        tables = pool.tables(batch, ctx)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
        q = torch.randn(batch, H, D, device=DEVICE, dtype=DTYPE)
        ms = bench(lambda: ref.paged_decode_attention(q, pool.k, pool.v, tables, lens,
                                                      D ** -0.5), 5, 50)
        tri = bench(lambda: paged_decode_attention(q, pool.k, pool.v, tables, lens,
                                                   D ** -0.5))
        rows.append({"op": "decode", "batch": batch, "context": ctx, "torch_ms": ms,
                     "triton_ms": tri})
    q, tables, cu, lens = extend_inputs(pool, 1, ctx, ctx)
    ms = bench(lambda: ref.paged_extend_attention(q, pool.k, pool.v, tables, cu, lens, ctx,
                                                  D ** -0.5), 5, 50)
    tri = bench(lambda: paged_extend_attention(q, pool.k, pool.v, tables, cu, lens, ctx,
                                               D ** -0.5))
    rows.append({"op": "extend", "batch": 1, "context": ctx, "torch_ms": ms, "triton_ms": tri})
    return rows


def sweep(pool, ceiling):
    rows = []
    dec_points = [(1, 8192), (16, 2048), (64, 2048), (64, 8192), (256, 2048)]
    ext_points = [(16, 2048, 512), (1, 8192, 8192), (64, 8192, 512)]
    if QUICK:
        dec_points, ext_points = [(16, 2048), (64, 8192)], [(16, 2048, 512), (1, 8192, 8192)]
    if SMOKE:
        dec_points, ext_points = [(2, 70)], [(2, 70, 20)]
    dec_cfgs = [dict(block_n=bn, num_warps=w, num_stages=s)
                for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3)]
    for batch, ctx in dec_points:
        for cfg in dec_cfgs + [dict(num_splits=n) for n in (1, 2, 4, 8, 16, 32, 64)]:
            try:
                r = decode_point(pool, batch, ctx, ceiling, graph=False, **cfg)
            except Exception as e:                            # noqa: BLE001
                r = {"batch": batch, "context": ctx, "error": repr(e)[:200]}
            rows.append({"op": "decode", **cfg, **r})
    ext_cfgs = [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
                for bm in (64, 128) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3)]
    for batch, ctx, n_new in ext_points:
        for cfg in ext_cfgs:
            try:
                r = extend_point(pool, batch, ctx, n_new, ceiling, **cfg)
            except Exception as e:                            # noqa: BLE001
                r = {"batch": batch, "context": ctx, "error": repr(e)[:200]}
            rows.append({"op": "extend", **cfg, **r})
    return rows


def main():
    global DEVICE, SMOKE, BATCHES, CONTEXTS, CHUNK, REF_BATCHES, REF_CTX, QUICK, H, H_KV, D
    global FAST
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="JSON results path")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--heads", type=int, default=H)
    ap.add_argument("--kv-heads", type=int, default=H_KV)
    ap.add_argument("--head-dim", type=int, default=D)
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    H, H_KV, D, QUICK = args.heads, args.kv_heads, args.head_dim, args.quick
    if args.cpu_smoke:
        DEVICE, SMOKE, BATCHES, CONTEXTS, CHUNK = "cpu", True, [1, 2], [40, 70], 16
        REF_BATCHES, REF_CTX = [1, 2], 40
    batches = [1, 64] if args.quick else BATCHES
    contexts = [512, 8192] if args.quick else CONTEXTS
    t0 = time.time()
    if SMOKE:
        name, sms = "cpu (interpreter smoke)", 0
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
    res = {"device": name, "sms": sms,
           "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "triton": triton.__version__, "shape": dict(H=H, H_kv=H_KV, D=D, block=BS,
                                                        dtype=str(DTYPE))}
    ceiling = copy_ceiling()
    res["copy_ceiling_TBps"] = ceiling
    pool = Pool(max(batches) * max(contexts))
    res["decode"] = [decode_point(pool, b, c, ceiling) for b in batches for c in contexts]
    ext = [(b, c, min(c, CHUNK)) for b in batches for c in contexts]
    ext += [(1, 70, 70)] if SMOKE else [(1, 8192, 8192), (16, 2048, 2048)]
    res["extend"] = [extend_point(pool, b, c, n, ceiling) for b, c, n in ext]
    res["reference"] = reference_points(pool)
    if args.sweep:
        FAST = True
        res["sweep"] = sweep(pool, ceiling)
        FAST = False
    res["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)

    print(f"\n{res['device']}  {res['date']}  torch {res['torch']}  triton {res['triton']}")
    print(f"copy ceiling (D2D, read+write): {ceiling:.2f} TB/s")
    print(f"\ndecode  ({H} q / {H_KV} kv heads, D={D}, bf16, block {BS})")
    print(f"{'batch':>5} {'ctx':>5} {'ms':>8} {'TB/s':>6} {'%copy':>6} {'graph ms':>9} {'TB/s':>6}")
    for r in res["decode"]:
        print(f"{r['batch']:>5} {r['context']:>5} {r['ms']:>8.4f} {r['TBps']:>6.2f} "
              f"{r['pct_copy']:>5.0f}% {r.get('graph_ms', float('nan')):>9.4f} "
              f"{r.get('graph_TBps', float('nan')):>6.2f}")
    print("\nextend (new tokens per sequence on top of the prefix)")
    print(f"{'batch':>5} {'ctx':>5} {'new':>5} {'ms':>8} {'TFLOP/s':>8} {'TB/s':>6}")
    for r in res["extend"]:
        print(f"{r['batch']:>5} {r['context']:>5} {r['new_tokens']:>5} {r['ms']:>8.4f} "
              f"{r['TFLOPs']:>8.1f} {r['TBps']:>6.2f}")
    print("\ntorch reference vs triton")
    for r in res["reference"]:
        print(f"{r['op']:>7} batch {r['batch']:>3} ctx {r['context']}: torch {r['torch_ms']:.3f} ms,"
              f" triton {r['triton_ms']:.4f} ms ({r['torch_ms'] / r['triton_ms']:.0f}x)")
    if args.sweep:
        print("\nsweep: best variant per point")
        best = {}
        for r in res["sweep"]:
            if "ms" not in r:
                continue
            key = (r["op"], r["batch"], r["context"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
        for key, r in best.items():
            cfg = {k: v for k, v in r.items() if k in ("block_m", "block_n", "num_warps",
                                                       "num_stages", "num_splits")}
            print(f"  {key}: {r['ms']:.4f} ms {cfg}")
    print(f"\n({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()

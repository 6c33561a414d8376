"""Batch-1 decode kernels: skinny linear sweep vs cuBLAS, decode merge, rotary_store_kv.

PYTHONPATH=. python3 scripts/bench_decode_ops.py [--out FILE.json] [--budget SECONDS]

Every time is a CUDA-graph replay (how the engine runs decode), per call, median of
several replays, with the weights cycled over enough copies that they never sit in L2
(like the 24 layers of a real model). Sections:
  sweep   linear tiles x split-K x path (dot / FMA) at M = 1 and 16 for Qwen2.5-0.5B's
          projections and lm_head, then warps/stages around the best
  fused   rms_norm_linear / silu_mul_linear vs the two ops they replace
  cross   plan_linear's default config vs cuBLAS for M = 1 .. 64 (the skinny crossover)
  decode  paged decode attention (splits merged by the last split program)
  rope    rotary_store_kv vs rotary_embedding + store_kv_cache
--dry runs a tiny version on CPU (TRITON_INTERPRET=1, eager timing) to check the script.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

DRY = "--dry" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402

from kernels import get_ops  # noqa: E402
from kernels import reference as ref  # noqa: E402
from kernels.linear import plan_linear  # noqa: E402

tri = get_ops("triton")
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
T0 = time.time()

SHAPES = {   # name: (N, K, bias)
    "qkv": (1152, 896, True), "o": (896, 896, False), "gate_up": (9728, 896, False),
    "down": (896, 4864, False), "lm_head": (151936, 896, False),
}
if DRY:
    SHAPES = {"qkv": (72, 48, True), "down": (40, 160, False)}
DOT_TILES = [(16, 128), (16, 256), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64),
             (128, 128)]
FMA_TILES = [(16, 256), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64),
             (2, 1024), (4, 1024), (8, 1024), (4, 512), (8, 512), (16, 512)]   # one K step
SPLITS = [1, 2, 4, 8, 10, 16]
if DRY:
    DOT_TILES, FMA_TILES, SPLITS = [(16, 32)], [(16, 32)], [1, 2]


def graph_ms(calls, reps=5):
    """Per-call ms of a CUDA graph holding `calls` (list of thunks), median of reps."""
    if DRY:
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) * 1e3 / len(calls)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / len(calls))
    del g
    return statistics.median(times)


def weights(n, k, bias, budget_bytes=320e6):
    copies = 2 if DRY else max(2, min(160, math.ceil(budget_bytes / (n * k * 2))))
    ws = [((torch.randn(n, k, device=DEV) / k ** 0.5).to(DT),
           torch.randn(n, device=DEV).to(DT) if bias else None) for _ in range(copies)]
    return ws


def time_linear(x, ws, **kw):
    return graph_ms([lambda w=w, b=b: tri.linear(x, w, b, max_m=64, **kw) for w, b in ws])


def time_cublas(x, ws):
    return graph_ms([lambda w=w, b=b: torch.nn.functional.linear(x, w, b) for w, b in ws])


def gbps(n, k, ms):
    return n * k * 2 / (ms * 1e-3) / 1e12


def sweep(res, budget, row_counts=(1, 16)):
    sms = torch.cuda.get_device_properties(0).multi_processor_count if not DRY else 4
    out = res.setdefault("sweep", {})
    for name, (n, k, bias) in SHAPES.items():
        ws = weights(n, k, bias)
        for m in row_counts:
            x = torch.randn(m, k, device=DEV).to(DT)
            want = ref.linear(x.double(), ws[0][0].double(),
                              None if ws[0][1] is None else ws[0][1].double())
            rows = []
            cub = time_cublas(x, ws)
            default = time_linear(x, ws)
            cands = [(True, t) for t in DOT_TILES] + ([(False, t) for t in FMA_TILES]
                                                      if m == 1 else [])
            for use_dot, (bn, bk) in cands:
                tiles = triton.cdiv(n, bn)
                for split in SPLITS:
                    if split > 1 and (triton.cdiv(k, bk) < split or tiles * split > 16 * sms):
                        continue
                    if tiles * split < sms // 4 and name != "lm_head":
                        continue
                    if name == "lm_head" and split > 1:
                        continue
                    kw = dict(use_dot=use_dot, block_n=bn, block_k=bk, split_k=split)
                    got = tri.linear(x, ws[0][0], ws[0][1], max_m=64, **kw)
                    err = ((got.double() - want).norm() / want.norm()).item()
                    ms = time_linear(x, ws, **kw)
                    rows.append({"ms": ms, "err": err, **kw})
                if time.time() - T0 > budget:
                    break
            rows.sort(key=lambda r: r["ms"])
            best = dict(rows[0])
            # warps / stages around the best tile
            tuned = []
            for nw, ns in [(2, 3), (4, 2), (4, 3), (4, 5), (8, 3), (8, 4)]:
                if time.time() - T0 > budget or DRY:
                    break
                kw = {k2: best[k2] for k2 in ("use_dot", "block_n", "block_k", "split_k")}
                tuned.append({"ms": time_linear(x, ws, num_warps=nw, num_stages=ns, **kw),
                              "num_warps": nw, "num_stages": ns, **kw})
            out[f"{name}/m{m}"] = {"cublas_ms": cub, "default_ms": default, "top": rows[:8],
                                   "tuned": sorted(tuned, key=lambda r: r["ms"]),
                                   "max_err": max(r["err"] for r in rows)}
            b0 = rows[0]
            print(f"{name:8s} m={m:2d} cublas {cub*1e3:7.2f} us ({gbps(n, k, cub):4.2f} TB/s) "
                  f"default {default*1e3:7.2f} best {b0['ms']*1e3:7.2f} us "
                  f"({gbps(n, k, b0['ms']):4.2f} TB/s) dot={b0['use_dot']} bn={b0['block_n']} "
                  f"bk={b0['block_k']} split={b0['split_k']}"
                  + (f" | tuned {tuned[0]['ms']*1e3:.2f} w{tuned[0]['num_warps']}"
                     f"s{tuned[0]['num_stages']}" if tuned else ""), flush=True)
        del ws
        if not DRY:
            torch.cuda.empty_cache()


def crossover(res):
    out = res.setdefault("cross", {})
    ms_list = [1, 2, 4, 8, 16, 24, 32, 64] if not DRY else [1, 3]
    for name in ("qkv", "o", "gate_up", "down"):
        if name not in SHAPES:
            continue
        n, k, bias = SHAPES[name]
        ws = weights(n, k, bias, 160e6)
        line = []
        for m in ms_list:
            x = torch.randn(m, k, device=DEV).to(DT)
            c, t = time_cublas(x, ws), time_linear(x, ws)
            out[f"{name}/m{m}"] = {"cublas_ms": c, "triton_ms": t}
            line.append(f"{m}:{t*1e3:.1f}/{c*1e3:.1f}")
        print(f"cross {name:8s} (triton/cublas us) " + " ".join(line), flush=True)
        del ws


def fused(res):
    out = res.setdefault("fused", {})
    hd = 48 if DRY else 896
    nw = (1 + 0.1 * torch.randn(hd, device=DEV)).to(DT)
    for name in ("qkv", "gate_up", "down", "lm_head"):
        if name not in SHAPES:
            continue
        n, k, bias = SHAPES[name]
        ws = weights(n, k, bias, 160e6)
        for m in (1, 16):
            if name == "down":
                x = torch.randn(m, 2 * k, device=DEV).to(DT)
                f = graph_ms([lambda w=w, b=b: tri.silu_mul_linear(x, w, b) for w, b in ws])
                u = graph_ms([lambda w=w, b=b: tri.linear(tri.silu_and_mul(x), w, b)
                              for w, b in ws])
            else:
                x = torch.randn(m, k, device=DEV).to(DT)
                r = torch.randn(m, k, device=DEV).to(DT)
                f = graph_ms([lambda w=w, b=b: tri.rms_norm_linear(x, nw[:k], 1e-6, w, b, r)
                              for w, b in ws])
                u = graph_ms([lambda w=w, b=b: tri.linear(tri.rms_norm(x, nw[:k], 1e-6, r)[0],
                                                          w, b) for w, b in ws])
            out[f"{name}/m{m}"] = {"fused_ms": f, "unfused_ms": u}
            print(f"fused {name:8s} m={m:2d} fused {f*1e3:7.2f} us  two ops {u*1e3:7.2f} us",
                  flush=True)
        del ws


def decode(res):
    out = res.setdefault("decode", {})
    h, h_kv, d, page, width = 14, 2, 64, 16, 512         # Qwen2.5-0.5B, max_model_len 8192
    if DRY:
        width = 16
    layers = 4 if DRY else 24
    for b, ctx in [(1, 640), (1, 2048), (1, 8192), (16, 640), (16, 2048), (64, 640),
                   (64, 2048)]:
        if DRY and ctx > 200:
            ctx = 100
        nb_seq = triton.cdiv(ctx, page)
        blocks = b * nb_seq * layers + 8
        kc = torch.randn(blocks, page, h_kv, d, device=DEV).to(DT)
        vc = torch.randn_like(kc)
        perm = torch.randperm(blocks, device=DEV)
        calls = []
        for li in range(layers):
            tab = torch.zeros(b, width, dtype=torch.int32, device=DEV)
            tab[:, :nb_seq] = perm[li * b * nb_seq:(li + 1) * b * nb_seq].view(b, nb_seq).int()
            lens = torch.full((b,), ctx, dtype=torch.int32, device=DEV)
            q = torch.randn(b, h, d, device=DEV).to(DT)
            calls.append(lambda q=q, t=tab, c=lens: tri.paged_decode_attention(
                q, kc, vc, t, c, d ** -0.5))
        ms = graph_ms(calls)
        out[f"b{b}/ctx{ctx}"] = {"ms": ms}
        print(f"decode b={b:3d} ctx={ctx:5d} {ms*1e3:6.2f} us", flush=True)
        del kc, vc


def rope(res):
    out = res.setdefault("rope", {})
    h, h_kv, d, page = 14, 2, 64, 16
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    cs = torch.cat([torch.outer(torch.arange(8192, device=DEV).float(), inv).cos(),
                    torch.outer(torch.arange(8192, device=DEV).float(), inv).sin()], -1)
    for t in [1, 16, 256]:
        qkv = torch.randn(t, h + 2 * h_kv, d, device=DEV).to(DT)
        q, k, v = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
        pos = torch.randint(0, 8192, (t,), device=DEV)
        kc = torch.randn(4096, page, h_kv, d, device=DEV).to(DT)
        vc = torch.randn_like(kc)
        slots = torch.randperm(4096 * page, device=DEV)[:t]
        n = 24

        def fused():
            tri.rotary_store_kv(pos, q, k, v, cs, True, kc, vc, slots)

        def split():
            qr, kr = tri.rotary_embedding(pos, q, k, cs, True)
            tri.store_kv_cache(kr, v, kc, vc, slots)
        r = {"fused": graph_ms([fused] * n), "separate": graph_ms([split] * n)}
        out[f"t{t}"] = r
        print(f"rope+store t={t:4d} fused {r['fused']*1e3:6.2f} us  "
              f"separate {r['separate']*1e3:6.2f} us", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the sweep")
    ap.add_argument("--sections", default="sweep,cross,fused,decode,rope")
    ap.add_argument("--rows", default="1,16", help="sweep: the row counts")
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    res = {"device": "cpu" if DRY else torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__}
    torch.manual_seed(0)
    rows = [int(r) for r in a.rows.split(",")]
    for sec in a.sections.split(","):
        t = time.time()
        {"sweep": lambda: sweep(res, a.budget, rows), "cross": lambda: crossover(res),
         "decode": lambda: decode(res), "rope": lambda: rope(res),
         "fused": lambda: fused(res)}[sec]()
        print(f"[{sec}: {time.time() - t:.1f} s]", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

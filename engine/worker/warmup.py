"""Compile every kernel variant a step can ask for, and upload every graph, at start-up.

Triton compiles a kernel the first time it sees a new set of constexprs. The graph
capture compiles what decode-only steps use, but mixed (eager) steps pick tile shapes
from the step itself: the extend kernel's BLOCK_M from the longest chunk, the decode
kernel's split count (and with it SINGLE / MERGE_ALL) from the widest block table. A
variant first met mid-serving stalls every running request for the compile (~0.5 s
on an H100: the first prefix-cache hit of a run showed a 486 ms inter-token gap).
Both kernels read nothing but the KV cache here, so the warm-up changes no state.

The same holds for the LM head of a mixed step, which runs eagerly on however many rows
sample, and for the first replay of each CUDA graph, which uploads it to the device:
W1's first timed run, the first to reach 256 sampled rows, ran 15 % slower than the
next four (H100, 2026-11-23; warming a few row counts and the graphs did not remove
that, so every row count is warmed now).

And for the previous step's samples fed to the next step's decodes out of order (a
request finished or joined under async scheduling): their gather and select kernels,
and the pinned buffers of their row indices, are first met at W1's first finish,
which stalled the device for 11-16 ms there (H200, 2026-11-28, scripts/gpu_idle.py).
"""
from __future__ import annotations

import inspect
import time

import numpy as np
import torch

from engine.worker.step_buffers import device_fed, gather_fed


@torch.inference_mode()
def warm_up_attention(runner) -> float:
    """Run decode and extend attention over every shape class; returns seconds taken."""
    t0 = time.perf_counter()
    layer = runner.model.attention_layers()[0]
    ops, dev, page = runner.ops, runner.device, runner.block_size
    k_cache, v_cache = layer.k_cache, layer.v_cache
    max_blocks = runner.max_blocks_per_seq
    q = torch.zeros(128, layer.num_heads, layer.head_dim, dtype=runner.dtype, device=dev)
    # decode: one sequence at every table width covers every split count a step can plan
    # (more sequences only lower it), so every SINGLE / MERGE_ALL variant
    for width in range(1, max_blocks + 1):
        table = torch.zeros(1, width, dtype=torch.int32, device=dev)
        lens = torch.full((1,), width * page, dtype=torch.int32, device=dev)
        ops.paged_decode_attention(q[:1], k_cache, v_cache, table, lens, layer.scale,
                                   **layer.kv_scales)
    # extend: chunk lengths 1, 2, 4, ... reach every BLOCK_M (tiles grow in powers of two)
    n = 1
    while n <= min(128, max_blocks * page):     # BLOCK_M tops out at 128 rows
        width = -(-n // page)
        table = torch.zeros(1, width, dtype=torch.int32, device=dev)
        cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
        lens = torch.full((1,), n, dtype=torch.int32, device=dev)
        ops.paged_extend_attention(q[:n], k_cache, v_cache, table, cu, lens, n, layer.scale,
                                   **layer.kv_scales)
        n *= 2
    if runner.scales_pending:
        _warm_up_calibration(runner, layer)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0


def _warm_up_calibration(runner, layer) -> None:
    """calculate_kv_scales' first step stores K/V unfused (rotary, then the store): its
    two kernels, on views of one fused qkv row as the model makes them, storing nothing
    (slot -1)."""
    h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    qkv = torch.zeros(1, h + 2 * h_kv, d, dtype=runner.dtype, device=runner.device)
    q, k, v = qkv[:, :h], qkv[:, h:h + h_kv], qkv[:, h + h_kv:]
    none = torch.full((1,), -1, dtype=torch.int64, device=runner.device)
    runner.ops.store_kv_cache(k, v, layer.k_cache, layer.v_cache, none, **layer.kv_scales)
    cos_sin = getattr(runner.model, "cos_sin_cache", None)      # rotary models
    if cos_sin is not None:
        runner.ops.rotary_embedding(none + 1, q, k, cos_sin, True)


WARM_EVERY_ROWS_UP_TO = 256   # then every 32nd row count


@torch.inference_mode()
def warm_up_logits(runner, max_rows: int) -> float:
    """compute_logits and greedy sampling at every row count a mixed step can sample
    (up to WARM_EVERY_ROWS_UP_TO, then every 32nd); returns seconds taken. Each row
    count can meet a new kernel: the skinny GEMM's Triton variants (BLOCK_M 16 or 32,
    M divisible by 16 or not, M = 1), and above 32 rows whichever cuBLAS kernel its
    heuristic picks for that M, loaded on first use (CUDA's lazy module loading). Not
    under tensor parallelism (its gather would have to be met by every rank at the same
    point)."""
    t0 = time.perf_counter()
    model = runner.model
    if model.tp.size > 1:
        return 0.0
    hidden = torch.zeros(max_rows, model.config.hidden_size, dtype=runner.dtype,
                         device=runner.device)
    inputs = len(inspect.signature(model.compute_logits).parameters)  # (hidden[, residual])
    every = list(range(1, min(max_rows, WARM_EVERY_ROWS_UP_TO) + 1))
    for rows in sorted(set(every + list(range(every[-1], max_rows + 1, 32)) + [max_rows])):
        model.compute_logits(*[hidden[:rows]] * inputs).argmax(dim=-1)
    torch.cuda.synchronize(runner.device)
    return time.perf_counter() - t0


@torch.inference_mode()
def warm_up_token_feed(device: torch.device, max_rows: int) -> float:
    """Feed the previous step's samples to decode rows out of order (gather_fed: a
    gather) and with a row not fed (a mask and a select: device_fed) at every power of
    two rows up to max_rows, so the kernels and the pinned index buffers of each size
    class exist before serving; returns seconds taken."""
    t0 = time.perf_counter()
    prev = torch.zeros(max_rows, dtype=torch.int64, device=device)
    n = 1
    while True:
        rows = np.arange(n - 1, -1, -1)                 # reversed: not one to one
        device_fed(prev, gather_fed(rows, prev[:n]))
        rows[-1] = -1                                   # a row the samples do not feed
        device_fed(prev, gather_fed(rows, prev[:n]))
        if n >= max_rows:
            break
        n = min(2 * n, max_rows)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def warm_up_logprobs(runner) -> float:
    """The logprobs kernel's variants a step can ask for (kernels/logprobs.py: its n is not
    a constexpr, so what varies is the source's dtype, the logits' or float32 from the
    processed path, rows picked or gathered (random rows), and normalised or not, per
    logprobs_mode and for the raw view); returns seconds taken."""
    t0 = time.perf_counter()
    top, dev = runner.ops.top_logprobs, runner.device
    norms = {runner.sampler.logprobs_mode.endswith("logprobs"), True}
    tok = torch.zeros(1, dtype=torch.int64, device=dev)
    for dtype in {runner.dtype, torch.float32}:
        src = torch.zeros(2, 64, dtype=dtype, device=dev)
        for normalize in norms:
            top(src, tok, 1, normalize, tok)
            top(src[:1], tok, 1, normalize)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0

"""Skinny GEMM for decode: y = x @ W^T (+ bias), W [N, K] in nn.Linear layout, with
optional fused prologues on x.

  linear(x, weight, bias)                      y = x W^T + b
  rms_norm_linear(x, norm_w, eps, weight, bias, residual)
                                               y = rms_norm(x [+ residual]) W^T + b
                                               (and the new residual x + residual)
  silu_mul_linear(x, weight, bias)             y = silu_and_mul(x) W^T + b

At batch 1..16 a projection reads its whole weight to produce a few rows, so it is bound
by how fast W streams from memory; cuBLAS's tiles are made for large M (docs/KERNELS.md
has the measurements). Above SKINNY_MAX_M rows (prefill, large decode batches), and for
unusual dtypes or layouts, every function here falls back to torch / cuBLAS (with the
Triton rms_norm / silu_and_mul for the fused variants).

Grid (cdiv(N, BLOCK_N), SPLIT_K). Program (n, s) reads the [BLOCK_N, K/SPLIT_K] slab of W
(K contiguous: 16-byte loads, BLOCK_K columns a step) and the M rows of x for that K range,
and accumulates in fp32:
  * DOT (M > 1): acc[BLOCK_N, BLOCK_M] += W_tile @ x_tile^T on tensor cores, x padded to
    BLOCK_M >= 16 rows with zeros (the weight tile is the large MMA operand);
  * FMA (M = 1): acc[BLOCK_N, BLOCK_K] += W_tile * x_row in fp32, summed over K at the end;
    at 2..ONE_STEP_MAX_M rows in one K step (the one-step plan), each row's products with
    the tile summed over K in turn.
Split-K partial sums (fp32, [SPLIT_K, M, N]) are merged in the same launch: each program
bumps a per-N-tile counter (atomic, acq_rel, after a barrier so all its threads' partials
are released) and the last of the SPLIT_K programs of a tile sums the partials in split
order (deterministic), adds the bias, writes y and resets the counter to 0 (a second
reduce kernel was slower: docs/KERNELS.md). The counters are persistent, zeroed once and
left zeroed by every launch: no memset per call, CUDA-graph safe. They are shared by all
calls on a device, which is safe while launches on a device do not overlap on several
streams (the engine runs one stream).
Prologues (PRO), applied to each x tile as it is loaded (no extra pass over x):
  1 = RMSNorm: h = x (+ residual, rounded to x.dtype and written out as the new residual by
      the programs of the first N tile); the MMA operand is h * norm_weight and the sum of
      h^2 accumulates along the same K loop, so y = rsqrt(mean(h^2) + eps) * acc (+ bias)
      at the end. Needs the whole K range in one program: no split-K. (The reference rounds
      h * rstd * w to x.dtype before the GEMM; here rstd is applied in fp32 after it,
      which differs by bf16 rounding only.)
  2 = SiLU-and-mul: x [M, 2K] = [gate | up]; the operand is silu(gate) * up, rounded to
      x.dtype as the reference does.
The grid and every constexpr come from shapes only; no host sync.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import pdl
from kernels._common import dot_precision, next_pow2, num_sms, zeroed_scratch
from kernels.pdl import pdl_enter

# Rows at or below which the Triton kernel runs; above it, cuBLAS. 32: with PDL the
# decode buckets 24 and 32 ran 4-6% faster than on cuBLAS, 48 and 64 slower (docs/KERNELS.md).
SKINNY_MAX_M = 32
FUSE_MAX_TILES_PER_SM = 8       # rms_norm_linear fuses at M = 1 up to this many 16-row tiles
# The M = 1 plan (docs/KERNELS.md "One row"): weights of at most ONE_STEP_MAX_ELEMS
# elements (qkv, o) take one K step per program with narrow tiles, so a program's whole
# slab loads before the PDL wait; larger ones (gate_up, down, lm_head) loop over K in
# M1_BLOCK_N x M1_BLOCK_K tiles: 16 x 256 (H200, batch-1 replay 0.553-0.563 -> 0.542 ms
# against 8 x 512; 8 x 256, 32 x 256, 16 x 128 and 4 x 1024 lost; one K step for every
# weight, or 16 x 256 tiles for qkv and o too, were slower on the H100).
ONE_STEP_MAX_ELEMS = 1 << 22
ONE_STEP_TILE_ELEMS = 8192      # weights per program and step: 64 per thread at 4 warps
# Up to ONE_STEP_MAX_M rows the small weights with K <= 1024 take the one-step plan too,
# each row's dot with the tile (H200, docs/KERNELS.md "A few rows in one K step"): the
# decode buckets 2 and 4 and a verify of 1 + 3 rows. With split-K (qwen3's o and down,
# K 2048-3072) several rows ran 2-3x slower than the tiles, and at 8 rows qwen3 lost 4 %.
ONE_STEP_MAX_M = 4
ONE_STEP_MAX_K = 1024           # K in one step; a wider K takes 512-wide splits
M1_BLOCK_N, M1_BLOCK_K = 16, 256
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _x_tile(x_ptr, r_ptr, nw_ptr, nr_ptr, offs_k, offs_m, mask, K,
            stride_xm, stride_xk, stride_rm, stride_nrm, write_res,
            BLOCK_M: tl.constexpr, PRO: tl.constexpr, HAS_RES: tl.constexpr,
            OUT_TY: tl.constexpr):
    """The [BLOCK_K, BLOCK_M] tile of x^T after the prologue, and its per-row sum of
    squares (RMSNorm prologue only; zeros otherwise)."""
    xp = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None] * stride_xk
    x = tl.load(xp, mask=mask, other=0.0)
    ss = tl.zeros([BLOCK_M], tl.float32)
    if PRO == 1:
        if HAS_RES:
            r = tl.load(r_ptr + offs_m[None, :] * stride_rm + offs_k[:, None], mask=mask,
                        other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(nr_ptr + offs_m[None, :] * stride_nrm + offs_k[:, None], x,
                     mask=mask & write_res)
        xf = x.to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        ss = tl.sum(xf * xf, 0)
        xo = (xf * nw[:, None]).to(OUT_TY)
    elif PRO == 2:
        up = tl.load(xp + K * stride_xk, mask=mask, other=0.0).to(tl.float32)
        g = x.to(tl.float32)
        xo = (g / (1.0 + tl.exp(-g)) * up).to(x_ptr.dtype.element_ty).to(OUT_TY)
    else:
        xo = x.to(OUT_TY)
    return xo, ss


@triton.jit
def _w_tile(w_rows, offs_k, m_mask, K, stride_wk, EVEN_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] weight tile at offs_k, and the mask of the matching x tile."""
    if EVEN_K:
        w = tl.load(w_rows + offs_k[None, :] * stride_wk)
        x_mask = m_mask[None, :]
    else:
        k_mask = offs_k < K
        w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=k_mask[None, :], other=0.0)
        x_mask = m_mask[None, :] & k_mask[:, None]
    return w, x_mask


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, r_ptr, nw_ptr, nr_ptr, eps,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn, stride_rm, stride_nrm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr, PREC: tl.constexpr, PRO: tl.constexpr, HAS_RES: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)      # clamped: weight loads need no mask
    w_rows = w_ptr + rows[:, None] * stride_wn
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    write_res = pid_n == 0
    ss = tl.zeros([BLOCK_M], tl.float32)
    w_ty = w_ptr.dtype.element_ty
    # The first weight tile is loaded before the PDL wait: no kernel writes the weights,
    # so its DRAM round trip overlaps the predecessor's tail instead of following it.
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    w, x_mask = _w_tile(w_rows, offs_k, m_mask, K, stride_wk, EVEN_K)
    pdl_enter(PDL)       # x (and the residual) come from the previous kernel
    x, ssk = _x_tile(x_ptr, r_ptr, nw_ptr, nr_ptr, offs_k, offs_m, x_mask, K,
                     stride_xm, stride_xk, stride_rm, stride_nrm, write_res,
                     BLOCK_M, PRO, HAS_RES, w_ty if USE_DOT else tl.float32)
    ss += ssk
    if USE_DOT:
        acc = tl.dot(w, x, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), input_precision=PREC)
        for k in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            w, x_mask = _w_tile(w_rows, offs_k, m_mask, K, stride_wk, EVEN_K)
            x, ssk = _x_tile(x_ptr, r_ptr, nw_ptr, nr_ptr, offs_k, offs_m, x_mask, K,
                             stride_xm, stride_xk, stride_rm, stride_nrm, write_res,
                             BLOCK_M, PRO, HAS_RES, w_ty)
            ss += ssk
            acc = tl.dot(w, x, acc, input_precision=PREC)
    elif BLOCK_M > 1:       # the one-step plan at a few rows: each row's dot with the tile
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        wf = w.to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            xm = tl.sum(tl.where(offs_m[None, :] == m, x, 0.0), 1)
            ym = tl.sum(wf * xm[None, :], 1)
            acc = tl.where(offs_m[None, :] == m, ym[:, None], acc)
    else:
        acc2 = w.to(tl.float32) * tl.sum(x, 1)[None, :]                # BLOCK_M == 1
        for k in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            w, x_mask = _w_tile(w_rows, offs_k, m_mask, K, stride_wk, EVEN_K)
            x, ssk = _x_tile(x_ptr, r_ptr, nw_ptr, nr_ptr, offs_k, offs_m, x_mask, K,
                             stride_xm, stride_xk, stride_rm, stride_nrm, write_res,
                             BLOCK_M, PRO, HAS_RES, tl.float32)
            ss += ssk
            acc2 += w.to(tl.float32) * tl.sum(x, 1)[None, :]
        acc = tl.sum(acc2, 1)[:, None]
    if PRO == 1:
        acc = acc * tl.rsqrt(ss / K + eps)[None, :]

    out_mask = n_mask[:, None] & m_mask[None, :]
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None] * stride_yn
    if not SPLIT:                           # this program owns its outputs
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        mn = offs_m[None, :] * N + offs_n[:, None]
        tl.store(ws_ptr + pid_k * M * N + mn, acc, mask=out_mask)
        tl.debug_barrier()                  # every thread's partial before the release below
        done = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if done == split_k - 1:
            tl.store(cnt_ptr + pid_n, 0)
            total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            for s in range(0, split_k):
                total += tl.load(ws_ptr + s * M * N + mn, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask,
                                 other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


def plan_linear(m: int, n: int, k: int, sms: int, elem: int = 2) -> dict:
    """Tiles and split-K from shapes only (graph safe); rules from the H100 sweep
    (scripts/bench_decode_ops.py, docs/KERNELS.md). elem: bytes per weight element
    (float32 dot tiles take half the K width so 4 pipeline stages fit in shared memory)."""
    if _one_step(m, n, k):
        return _plan_one_step(n, k, sms)
    if m == 1:
        # FMA path, looping over K; split K until ~4 programs per SM
        block_n, block_k = M1_BLOCK_N, min(M1_BLOCK_K, max(16, next_pow2(k)))
        tiles, k_tiles = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
        split = max(1, min(k_tiles, triton.cdiv(4 * sms, tiles)))
        use_dot = False
    else:
        use_dot, block_k = True, min(128 if elem <= 2 else 64, max(16, next_pow2(k)))
        k_tiles = triton.cdiv(k, block_k)
        if k_tiles > 8:                 # long K (down_proj): 32-row tiles, split-K
            block_n = 32
            tiles = triton.cdiv(n, block_n)
            split = max(1, min(k_tiles // 4, triton.cdiv(2 * sms, tiles)))
        else:                           # one K pass; width by how many tiles N makes
            block_n = 16 if n <= 16 * sms else _mid_width(m, n, sms)
            split = 1
    return {"block_n": block_n, "block_k": block_k, "split_k": split, "num_warps": 4,
            "num_stages": 4, "use_dot": use_dot}


def _mid_width(m: int, n: int, sms: int) -> int:
    """The one-K-pass tile width for an N of more than 16 rows an SM: at up to 16 rows 64
    where that still gives every SM a program, else 32; above, 128 (or 64 past 128 rows an
    SM). H200 (docs/KERNELS.md "Tile widths at 2-32 rows"): at 2-16 rows qwen3-0.6b's
    gate_up and qkv on 32 (not 128: 48 and 32 programs) and qwen2.5-0.5b's gate_up on 64
    replayed 1-3 % faster; at 32 rows 64 lost 9 % on qwen2.5-0.5b."""
    if m <= 16:
        return 64 if triton.cdiv(n, 64) >= sms else 32
    return 128 if n <= 128 * sms else 64


def _one_step(m: int, n: int, k: int) -> bool:
    """The one-step plan's reach: a weight of at most ONE_STEP_MAX_ELEMS at one row, and
    at up to ONE_STEP_MAX_M rows where K is one step (no split)."""
    return n * k <= ONE_STEP_MAX_ELEMS and (
        m == 1 or (m <= ONE_STEP_MAX_M and k <= ONE_STEP_MAX_K))


def _plan_one_step(n: int, k: int, sms: int) -> dict:
    """One K step per program (`_one_step`): the program's whole slab is in flight at
    once (and loaded before the PDL wait). K up to ONE_STEP_MAX_K in one step, else
    512-wide splits; the tile narrows until there are >= 2 programs per SM."""
    block_k = max(16, next_pow2(k)) if k <= ONE_STEP_MAX_K else 512
    split = triton.cdiv(k, block_k)
    block_n = max(1, ONE_STEP_TILE_ELEMS // block_k)
    while block_n > 2 and triton.cdiv(n, block_n) * split < 2 * sms:
        block_n //= 2
    return {"block_n": block_n, "block_k": block_k, "split_k": split, "num_warps": 4,
            "num_stages": 1, "use_dot": False}


def _skinny(x, weight, bias, k_x, limit):
    """Row count if the Triton path applies, else 0."""
    if weight.dim() != 2 or x.shape[-1] != k_x or x.dtype != weight.dtype:
        return 0
    if x.dtype not in _FLOATS or x.device != weight.device:
        return 0
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        return 0
    m = x.numel() // k_x if k_x else 0
    if m > 1 and x.dtype == torch.float32 and x.is_cuda:
        # exact fp32 tl.dot ("ieee") runs without tensor cores: on an H100 a float32
        # verify step (4 rows) took 7.0 ms through it against 1.2 ms for a 1-row decode
        # (2026-11-25); cuBLAS's fp32 GEMM (no tf32) reads the weights once at memory speed
        return 0
    return m if 0 < m <= limit else 0


def _run(x2, weight, bias, m, n, k, overrides, pro=0, res=None, norm_w=None, eps=0.0):
    cfg = plan_linear(m, n, k, num_sms(x2.device), weight.element_size())
    cfg.update({key: v for key, v in overrides.items() if v is not None})
    if cfg["use_dot"]:
        block_m = max(16, next_pow2(m))
    else:
        block_m = next_pow2(m)
    block_k, block_n = cfg["block_k"], cfg["block_n"]
    k_tiles = triton.cdiv(k, block_k)
    split = 1 if pro == 1 else max(1, min(cfg["split_k"], k_tiles))
    k_per_split = triton.cdiv(k_tiles, split) * block_k
    split = triton.cdiv(k, k_per_split)
    assert block_m == 1 or cfg["use_dot"] or k_per_split == block_k, \
        "the FMA path takes several rows in one K step only"
    tiles = triton.cdiv(n, block_n)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    cnt = ws = y
    if split > 1:
        cnt = zeroed_scratch(x2.device, "linear_counters", tiles, torch.int32)
        ws = torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
    b = bias if bias is not None else y
    new_res = None
    r2 = nw = nr = y
    if pro == 1:
        nw = norm_w
        if res is not None:
            r2 = res
            new_res = nr = torch.empty((m, k), dtype=x2.dtype, device=x2.device)
    _linear_kernel[(tiles, split)](
        x2, weight, b, y, ws, cnt, r2, nw, nr, float(eps), m, n, k, k_per_split, split,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
        y.stride(0), y.stride(1), r2.stride(0), nr.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split > 1,
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, USE_DOT=cfg["use_dot"],
        PREC=dot_precision(x2.dtype), PRO=pro, HAS_RES=new_res is not None,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl.launch_args(x2.device),
    )
    return y, new_res


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           max_m: int | None = None, **overrides) -> torch.Tensor:
    """y = x @ weight^T + bias (F.linear semantics). x [..., K], weight [N, K], bias [N].

    Keyword overrides (max_m, block_n, block_k, split_k, num_warps, num_stages, use_dot)
    exist for the tests and the benchmark sweep; callers leave them unset.
    """
    k = weight.shape[-1] if weight.dim() == 2 else -1
    m = _skinny(x, weight, bias, k, SKINNY_MAX_M if max_m is None else max_m)
    if not m:
        return F.linear(x, weight, bias)
    y, _ = _run(x.reshape(m, k), weight, bias, m, weight.shape[0], k, overrides)
    return y.view(*x.shape[:-1], weight.shape[0])


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None, *, max_m: int | None = None,
                    **overrides):
    """linear(rms_norm(x, norm_weight, eps[, residual]), weight, bias).

    Without residual returns y; with it returns (y, x + residual) like rms_norm does.
    fuse (None = auto, `_fuses_norm`): run the norm as the GEMM's prologue, or as its own
    kernel before a plain linear. At one row it wins (H100, Qwen2.5-0.5B qkv 5.0 vs 6.1
    us, gate_up 8.6 vs 10.2 us); on the tensor-core tiles (16 rows) or lm_head's 9496
    tiles, which each re-read x, it loses.
    """
    k = x.shape[-1]
    limit = SKINNY_MAX_M if max_m is None else max_m
    m = _skinny(x, weight, bias, k, limit)
    if m and (weight.shape[1] != k or norm_weight.shape != (k,)
              or norm_weight.stride(0) != 1 or x.stride(-1) != 1
              or (residual is not None and (residual.shape != x.shape
                                            or residual.stride(-1) != 1))):
        m = 0
    fuse = overrides.pop("fuse", None)
    if fuse is None:
        fuse = _fuses_norm(m, weight.shape[0], k, x.device)
    if not m or not fuse:
        from kernels.norm import rms_norm
        if residual is None:
            return linear(rms_norm(x, norm_weight, eps), weight, bias, max_m=limit, **overrides)
        h, new_res = rms_norm(x, norm_weight, eps, residual)
        return linear(h, weight, bias, max_m=limit, **overrides), new_res
    r2 = None if residual is None else residual.reshape(m, k)
    y, new_res = _run(x.reshape(m, k), weight, bias, m, weight.shape[0], k, overrides,
                      pro=1, res=r2, norm_w=norm_weight, eps=eps)
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if residual is None else (y, new_res.view(x.shape))


def _fuses_norm(m: int, n: int, k: int, device) -> bool:
    """Auto rule of rms_norm_linear: the norm as the prologue at one row (at most
    FUSE_MAX_TILES_PER_SM 16-row N tiles an SM, so not lm_head, whose tiles would each
    re-read x), and at up to ONE_STEP_MAX_M rows where the one-step plan gives every
    program the whole K (qkv): each program normalises the rows it reads anyway."""
    if m == 1:
        return triton.cdiv(n, 16) <= FUSE_MAX_TILES_PER_SM * num_sms(device)
    return m > 1 and _one_step(m, n, k)


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    *, max_m: int | None = None, **overrides) -> torch.Tensor:
    """linear(silu_and_mul(x), weight, bias): x [..., 2K] = [gate | up], weight [N, K].

    fuse (None = auto): SiLU-and-mul as the GEMM's prologue (auto: one row only; H100
    down_proj 7.1 vs 8.2 us at one row, 10.1 vs 8.8 us at 16 rows).
    """
    k = weight.shape[-1] if weight.dim() == 2 else -1
    limit = SKINNY_MAX_M if max_m is None else max_m
    m = _skinny(x, weight, bias, 2 * k, limit)
    fuse = overrides.pop("fuse", None)
    if not m or not (m == 1 if fuse is None else fuse):
        from kernels.activation import silu_and_mul
        return linear(silu_and_mul(x), weight, bias, max_m=limit, **overrides)
    y, _ = _run(x.reshape(m, 2 * k), weight, bias, m, weight.shape[0], k, overrides, pro=2)
    return y.view(*x.shape[:-1], weight.shape[0])

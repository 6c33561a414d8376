"""The CPU backend's linear layers: oneDNN matmuls on weights packed once, in its
blocked layout, plus the norm and activation ops fused around them in few torch ops.

Why: a decode step of 16 tokens multiplies skinny [16, K] activations by every weight
of the model, so it streams the weights from memory each step (23 MB in float32 for
the bundled model, more than this core's caches hold). F.linear reads the nn.Linear
[N, K] layout through MKL's transposed GEMM; oneDNN on a weight reordered once into
its blocked layout reads it sequentially and runs the step's linears about 2x faster
on one core (docs/PERF.md "CPU decode"). Same math in the weight's dtype (float32:
only the summation order differs). A weight is packed on first use and the packed
copy kept on the tensor, keyed by its version (an in-place change repacks it); the
CPU engine so holds each linear weight twice (the original stays for loading, the
tied embedding and the other backends). Without oneDNN (or for dtypes it does not
pack) these are the references.

Only skinny inputs (at most ONEDNN_MAX_ROWS rows) take the oneDNN path: oneDNN builds
and keeps a JIT kernel for every row count it meets, so a mixed step's arbitrary token
counts grew the engine process by ~20 MB per 6,000 churned steps (soak, 2026-11-23);
wide inputs (prefill chunks), where MKL's GEMM is efficient anyway, use F.linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.reference import _norm_then_linear

PACK_BATCH_HINT = 16        # rows oneDNN picks its weight layout for: a decode batch
ONEDNN_MAX_ROWS = 32        # wider inputs use F.linear (bounds oneDNN's kernels per weight)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                             "_reorder_linear_weight")
# oneDNN packs bfloat16 only where the CPU converts it natively (AVX-512 BW/VL/DQ or
# AVX-NE-CONVERT); elsewhere (an AVX2 EPYC, say) its reorder raises, so bfloat16 weights
# stay unpacked and take F.linear.
_PACKABLE = (torch.float32,) + ((torch.bfloat16,) if _ONEDNN and
                                torch.ops.mkldnn._is_mkldnn_bf16_supported() else ())


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of weight [N, K], made once and kept on the tensor; None
    where oneDNN does not apply (then callers use F.linear)."""
    if not _ONEDNN or weight.dtype not in _PACKABLE or weight.device.type != "cpu":
        return None
    cached = getattr(weight, "_onednn_packed", None)
    if cached is not None and cached[0] == weight._version:
        return cached[1]
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
    weight._onednn_packed = (weight._version, packed)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias (as F.linear), through the packed weight."""
    shape = x.shape
    skinny = x.dtype == weight.dtype and x.numel() <= ONEDNN_MAX_ROWS * shape[-1]
    packed = packed_weight(weight) if skinny else None
    if packed is None:
        return F.linear(x, weight, bias)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]).contiguous(), packed,
                                           bias, "none", [], "")
    return y.view(*shape[:-1], weight.shape[0])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """As reference.rms_norm, in float32 without casts (fewer ops per layer)."""
    if x.dtype != torch.float32:
        from kernels.reference import rms_norm as ref_rms_norm
        return ref_rms_norm(x, weight, eps, residual)
    if residual is not None:
        x = x + residual
    scale = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    out = (x * scale).mul_(weight)
    return out if residual is None else (out, x)


rms_norm_linear = _norm_then_linear(rms_norm, linear)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up, [T, I] (float32: in place on silu's
    output, no casts)."""
    if x.dtype != torch.float32:
        from kernels.reference import silu_and_mul as ref_silu_and_mul
        return ref_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu_and_mul(x), weight, bias): x [..., 2K] = [gate | up], weight [N, K]."""
    return linear(silu_and_mul(x), weight, bias)

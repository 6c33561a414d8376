"""FP8 KV cache: the quantization every backend shares (plain torch, no Triton).

A cache of dtype float8_e4m3fn holds `value / scale` per KV head, saturated to ±448 (the
largest finite e4m3 value: e4m3fn has no infinity, and an overflow must not become NaN),
rounded to nearest even. Reading multiplies by the head's scale again. The scales are
[H_kv] float32 per layer, one for K and one for V (a per-tensor scale is the case where
all heads hold the same number); None means unit scales. docs/KV_TIERS.md "FP8" says why
per head, and where each backend dequantizes.
"""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# calculate_kv_scales maps a head's largest |value| in the first step to half the e4m3
# range: one binade of headroom for later tokens (e4m3's relative precision is the same
# in every normal binade, so the headroom costs only at the subnormal end)
CALIBRATION_TARGET = FP8_MAX / 2


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_DTYPE


def quantize(x: torch.Tensor, cache_dtype: torch.dtype,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., H_kv, D] as the cache stores it: a cast, or for fp8 x / scale[head]
    (float32, correctly rounded), saturated, rounded to e4m3."""
    if not is_fp8(cache_dtype):
        if scale is not None:
            raise ValueError("KV scales apply to an fp8 cache only")
        return x.to(cache_dtype)
    xf = x.float()
    if scale is not None:
        xf = xf / scale.float()[:, None]
    return xf.clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)


def dequantize(rows: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype,
               head_dim: int = -2) -> torch.Tensor:
    """Cache rows (heads on `head_dim`, the last dim D) in `dtype`: a cast, or for fp8
    the stored codes times their head's scale (in float32, then cast)."""
    if not is_fp8(rows.dtype):
        return rows if rows.dtype == dtype else rows.to(dtype)
    out = rows.float()
    if scale is not None:
        shape = [1] * out.dim()
        shape[head_dim] = scale.shape[0]
        out = out * scale.float().view(shape)
    return out if dtype == torch.float32 else out.to(dtype)


def scales_from(x: torch.Tensor) -> torch.Tensor:
    """[H_kv] scales from values x [T, H_kv, D] (calculate_kv_scales): each head's
    largest |value| lands on CALIBRATION_TARGET; a head of zeros (or no tokens) keeps 1."""
    if x.shape[0] == 0:
        return torch.ones(x.shape[1], dtype=torch.float32, device=x.device)
    amax = x.float().abs().amax(dim=(0, 2))
    return torch.where(amax > 0, amax / CALIBRATION_TARGET, torch.ones_like(amax))


def byte_view(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 cache as uint8 (same bytes) for the copies torch has no fp8 kernel for
    (index_copy_ on the CPU); other caches as they are."""
    return cache.view(torch.uint8) if is_fp8(cache.dtype) else cache

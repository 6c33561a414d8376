"""Triton backend: same functions, signatures and semantics as kernels/reference.py.

Each kernel lives in its own module (see docs/KERNELS.md for the designs):
  kv_store.py          store_kv_cache
  decode_attention.py  paged_decode_attention   (split-K, GQA packed, graph-safe),
                       rotary_decode_attention  (+ rotary and the K/V store, one launch)
  decode_order.py      decode_order             (rows longest context first, for both)
  extend_attention.py  paged_extend_attention   (causal flash attention, paged)
  unified_attention.py paged_unified_attention  (decodes + chunks in one launch, graph-safe;
                       CUDA path only: no twin in reference.py, see its oracle there)
  norm.py              rms_norm                 (fused residual add)
  rotary.py            rotary_embedding
  activation.py        silu_and_mul
  linear.py            linear, rms_norm_linear, silu_mul_linear
                       (skinny GEMM + fused prologues; cuBLAS above 16 rows)
  rotary_kv.py         rotary_store_kv          (rotary + KV-cache store, one launch)
  argmax.py            argmax                   (greedy tokens, one launch, graph-safe)
  logprobs.py          top_logprobs             (a few rows' token, top n and rank, one launch)
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors.
"""
from __future__ import annotations

from kernels.activation import silu_and_mul
from kernels.argmax import argmax
from kernels.decode_attention import paged_decode_attention, rotary_decode_attention
from kernels.decode_order import decode_order
from kernels.extend_attention import paged_extend_attention
from kernels.kv_store import store_kv_cache
from kernels.linear import linear, rms_norm_linear, silu_mul_linear
from kernels.logprobs import top_logprobs
from kernels.norm import rms_norm
from kernels.rotary import rotary_embedding
from kernels.rotary_kv import rotary_store_kv
from kernels.unified_attention import paged_unified_attention

__all__ = ["store_kv_cache", "paged_decode_attention", "paged_extend_attention",
           "rms_norm", "rotary_embedding", "silu_and_mul", "linear", "rms_norm_linear", "silu_mul_linear",
           "rotary_store_kv", "paged_unified_attention", "rotary_decode_attention", "argmax",
           "decode_order", "top_logprobs"]

"""The online-softmax step shared by the paged attention kernels (decode and extend).

attend_tile gathers a KV tile through the block table and folds it in. Its pieces
(kv_rows, then the loads, then softmax_step) are also used apart: the decode kernel
loads its first tile before the PDL wait and folds it once the query is ready
(kernels/decode_attention.py).

An fp8 tile is converted to the query's dtype in registers (exact: every e4m3 value is a
float16 / bfloat16 / float32 value) just before its dot; its per-head scales never touch
the tile: the caller folds the K scale into scale_log2 and multiplies the output by the
V scale (one KV head per program, so each is one number)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_rows(kv, kv_valid, bt_row, stride_btm, stride_kb, stride_ks, stride_vb, stride_vs,
            PAGE: tl.constexpr, MASKED: tl.constexpr):
    """Element offsets of the K and V rows of the tokens at positions kv (block table
    lookups; MASKED: only where kv_valid)."""
    if MASKED:
        page = tl.load(bt_row + (kv // PAGE) * stride_btm, mask=kv_valid, other=0).to(tl.int64)
    else:
        page = tl.load(bt_row + (kv // PAGE) * stride_btm).to(tl.int64)
    return page * stride_kb + (kv % PAGE) * stride_ks, page * stride_vb + (kv % PAGE) * stride_vs


@triton.jit
def softmax_step(q, m_i, l_i, k, s_mask, scale_log2, PREC: tl.constexpr, MASKED: tl.constexpr):
    """Scores of q against the K tile: (new running max, old-to-new rescale factor,
    unnormalised probabilities, new running sum)."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PREC) * scale_log2
    if MASKED:
        s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


@triton.jit
def attend_tile(q, m_i, l_i, acc, kv, kv_valid, s_mask, bt_row, k_head, v_head, offs_d, d_mask,
                stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,
                scale_log2, PAGE: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr):
    """Fold the KV tile at token positions kv (gathered through the block table) into the
    running max m_i, sum l_i and output acc of the query rows q. MASKED: kv_valid marks
    the tokens that exist and s_mask [rows, tile] the scores to keep; otherwise every
    token exists and every score is kept."""
    row_k, row_v = kv_rows(kv, kv_valid, bt_row, stride_btm, stride_kb, stride_ks, stride_vb,
                           stride_vs, PAGE, MASKED)
    if MASKED:
        kv_mask = kv_valid[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    k = tl.load(k_head + row_k[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    m_new, alpha, p, l_i = softmax_step(q, m_i, l_i, k, s_mask, scale_log2, PREC, MASKED)
    v = tl.load(v_head + row_v[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PREC)
    return m_new, l_i, acc

"""The online-softmax step shared by the paged attention kernels (decode and extend)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(q, m_i, l_i, acc, kv, kv_valid, s_mask, bt_row, k_head, v_head, offs_d, d_mask,
                stride_btm, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,
                scale_log2, PAGE: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr):
    """Fold the KV tile at token positions kv (gathered through the block table) into the
    running max m_i, sum l_i and output acc of the query rows q. MASKED: kv_valid marks
    the tokens that exist and s_mask [rows, tile] the scores to keep; otherwise every
    token exists and every score is kept."""
    if MASKED:
        page = tl.load(bt_row + (kv // PAGE) * stride_btm, mask=kv_valid, other=0).to(tl.int64)
        kv_mask = kv_valid[:, None] & d_mask[None, :]
    else:
        page = tl.load(bt_row + (kv // PAGE) * stride_btm).to(tl.int64)
        kv_mask = d_mask[None, :]
    row_k = page * stride_kb + (kv % PAGE) * stride_ks
    row_v = page * stride_vb + (kv % PAGE) * stride_vs
    k = tl.load(k_head + row_k[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
    if MASKED:
        s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_head + row_v[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc

"""The online-softmax step shared by the paged attention kernels (decode and extend).

attend_tile gathers a KV tile through the block table and folds it in. Its pieces
(kv_rows, then the loads, then softmax_step) are also used apart: the decode kernel
loads its first tile before the PDL wait and folds it once the query is ready
(kernels/decode_attention.py).

An fp8 tile's dots run in float16 for 16-bit queries, float32 for float32 ones (exact:
every e4m3 value is a float16 value; a 16-bit query is rounded to float16 once, saturated at ±65504, and the probabilities are in [0, 1]).
K is converted after its shared-memory load. V, the dot's transposed operand, is read
as int16 pairs and widened to float16 in registers before it reaches shared memory:
converted there instead, Triton reads the fp8 tile a byte at a time (64 LDS.U8 a thread
a tile) and the kernel ran at half its bytes' floor. The per-head scales never touch a
tile: the caller folds the K scale into scale_log2 and multiplies the output by the V
scale (one KV head per program, so each is one number)."""
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
def q_f16(q):
    """The query as an fp8 tile's dot takes it: float16, saturated (bf16 reaches past
    float16's ±65504)."""
    return tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)


@triton.jit
def load_v(v_head, row_v, kv_valid, offs_d, d_mask, stride_vd, HEAD_DIM: tl.constexpr,
           MASKED: tl.constexpr):
    """The V tile at rows row_v (element offsets from v_head) as stored; fp8 as int16
    pairs [N, D/2] (contiguous rows whose offsets are multiples of 16 bytes: check_kv),
    for widen_v."""
    if v_head.dtype.element_ty == tl.float8e4nv:
        offs = tl.arange(0, offs_d.shape[0] // 2)
        ptrs = (v_head.to(tl.pointer_type(tl.int16)) + tl.multiple_of(row_v // 2, 8)[:, None]
                + offs[None, :])
        mask = (offs < HEAD_DIM // 2)[None, :]
        if MASKED:
            mask = kv_valid[:, None] & mask
        return tl.load(ptrs, mask=mask, other=0)
    else:
        if MASKED:
            mask = kv_valid[:, None] & d_mask[None, :]
        else:
            mask = d_mask[None, :]
        return tl.load(v_head + row_v[:, None] + offs_d[None, :] * stride_vd, mask=mask,
                       other=0.0)


@triton.jit
def widen_v(v):
    """load_v's tile in the dtype its dot takes: fp8's int16 pairs split into their two
    e4m3 bytes, converted to float16 (exact) and interleaved back in registers, other
    tiles as they are."""
    if v.dtype == tl.int16:
        lo = v.to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = (v >> 8).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        pairs = tl.join(lo, hi)       # [N, D/2, 2]
        return tl.reshape(pairs, [v.shape[0], 2 * v.shape[1]])
    else:
        return v


@triton.jit
def pv_step(acc, alpha, p, v, q, PREC: tl.constexpr):
    """acc rescaled by alpha plus the probabilities p times the V tile from load_v."""
    dt = tl.float16 if (v.dtype == tl.float16) & (q.dtype != tl.float32) else q.dtype
    return acc * alpha[:, None] + tl.dot(p.to(dt), v.to(dt), input_precision=PREC)


@triton.jit
def softmax_step(q, m_i, l_i, k, s_mask, scale_log2, PREC: tl.constexpr, MASKED: tl.constexpr):
    """Scores of q against the K tile: (new running max, old-to-new rescale factor,
    unnormalised probabilities, new running sum)."""
    if (k.dtype == tl.float8e4nv) & (q.dtype != tl.float32):
        s = tl.dot(q_f16(q), tl.trans(k.to(tl.float16)), input_precision=PREC) * scale_log2
    else:
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
                scale_log2, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, PREC: tl.constexpr,
                MASKED: tl.constexpr):
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
    v = load_v(v_head, row_v, kv_valid, offs_d, d_mask, stride_vd, HEAD_DIM, MASKED)
    return m_new, l_i, pv_step(acc, alpha, p, widen_v(v), q, PREC)

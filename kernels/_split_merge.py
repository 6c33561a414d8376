"""The merge of split-K decode attention's partials (kernels/decode_attention.py): the
last valid split program of a (sequence, KV head) to finish (a per-(b, kvh) counter bumped
with an acq_rel atomic after a barrier; the last one resets it, so the persistent
counters stay zeroed and no memset is needed) folds every split's running max, sum and
output into the result (rescaling by exp2(m - max)): one launch, no reduce kernel."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_splits(out_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr, b64, kvh, ctx, tokens_per_split,
                 num_heads, num_splits, offs_d, d_mask, vs, stride_ob, stride_oh, stride_od,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 MERGE_G: tl.constexpr, MERGE_S: tl.constexpr, MERGE_ALL: tl.constexpr):
    """Called by every split program after storing its partials (pm, pl, pacc)."""
    # The last valid split of (b, kvh) to finish merges them all: every thread's
    # partials are stored before the barrier, the counter bump releases them and
    # acquires the others'; the last one resets the counter for the next launch.
    tl.debug_barrier()
    n_valid = (ctx + tokens_per_split - 1) // tokens_per_split
    cidx = b64 * tl.num_programs(1) + kvh
    done = tl.atomic_add(cnt_ptr + cidx, 1, sem="acq_rel", scope="gpu")
    if done == n_valid - 1:
        tl.store(cnt_ptr + cidx, 0)
        # merge rows: the GROUP heads padded to MERGE_G (no tl.dot here, so no
        # 16-row minimum); the running max of every valid split in one load
        offs_h = tl.arange(0, MERGE_G)
        h_mask = offs_h < GROUP
        base = (b64 * num_heads + kvh * GROUP + offs_h) * num_splits     # [MERGE_G]
        offs_all = tl.arange(0, MERGE_ALL)
        am = h_mask[:, None] & (offs_all < n_valid)[None, :]
        m_max = tl.max(tl.load(pm_ptr + base[:, None] + offs_all[None, :], mask=am,
                               other=float("-inf"), cache_modifier=".cg"), 1)
        m_max = tl.where(h_mask, m_max, 0.0)
        l_tot = tl.zeros([MERGE_G], tl.float32)
        acc_tot = tl.zeros([MERGE_G, BLOCK_D], tl.float32)
        for s0 in range(0, n_valid, MERGE_S):
            offs_s = s0 + tl.arange(0, MERGE_S)
            sm = h_mask[:, None] & (offs_s < n_valid)[None, :]           # [G, S]
            idx = base[:, None] + offs_s[None, :]
            mc = tl.load(pm_ptr + idx, mask=sm, other=float("-inf"),
                         cache_modifier=".cg")
            w = tl.where(sm, tl.exp2(mc - m_max[:, None]), 0.0)
            lc = tl.load(pl_ptr + idx, mask=sm, other=0.0, cache_modifier=".cg")
            l_tot += tl.sum(lc * w, 1)
            a = tl.load(pacc_ptr + idx[:, :, None] * HEAD_DIM
                        + offs_d[None, None, :],
                        mask=sm[:, :, None] & d_mask[None, None, :], other=0.0,
                        cache_modifier=".cg")                            # [G, S, D]
            acc_tot += tl.sum(a * w[:, :, None], 1)
        out = acc_tot * (vs / tl.where(l_tot > 0.0, l_tot, 1.0))[:, None]
        tl.store(out_ptr + b64 * stride_ob + (kvh * GROUP + offs_h)[:, None] * stride_oh
                 + offs_d[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
                 mask=h_mask[:, None] & d_mask[None, :])

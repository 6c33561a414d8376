/* Paged decode attention of one sequence in the native CPU kernels: every query head
 * against the sequence's cached K / V rows, read straight from their blocks. */
#include <math.h>
#include <string.h>

#include "cpu_native.h"
#include "cpu_native_simd.h"

static float dot(const float *a, const float *b, int64_t d) {
    int64_t i = 0;
    vf acc = {0};
    for (; i + RP_WIDTH <= d; i += RP_WIDTH) acc = vfma(vload(a + i), vload(b + i), acc);
    float total = vsum(acc);
    for (; i < d; i++) total += a[i] * b[i];
    return total;
}

/* s[i] = exp(s[i] - max) in place, returns their sum */
static float softmax_numerators(float *s, int64_t len) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < len; i++) mx = s[i] > mx ? s[i] : mx;
    const vf vmx = vdup(mx);
    vf acc = {0};
    int64_t i = 0;
    for (; i + RP_WIDTH <= len; i += RP_WIDTH) {
        const vf e = vexp(vload(s + i) - vmx);
        vstore(s + i, e);
        acc += e;
    }
    if (i < len) {                      /* the tail through the same exp, its lanes masked */
        const vf e = vexp(vload_n(s + i, len - i) - vmx);
        vstore_n(s + i, e, len - i);
        acc += (vf)((vi)e & (viota() < (vi){0} + (int32_t)(len - i)));
    }
    return vsum(acc);
}

/* The query heads one pass over a sequence's rows serves at head size d (a multiple of
 * RP_WIDTH): as many as have their value accumulators fit RP_ACC registers, at least 1. */
int64_t heads_per_pass(int64_t d) {
    const int64_t v = d / RP_WIDTH;
    return v >= RP_ACC ? 1 : RP_ACC / v;
}

/* The heads [0, nh) of one sequence (nh <= heads_per_pass(HD)) against its cached keys
 * and values, each token's row of all KV heads read once per pass: scores (scale *
 * q . k_t), softmax per head, then the probability-weighted values, in slices of DV
 * vectors of the head where one head's accumulators exceed RP_ACC. rows[t]: token t's
 * row offset in the caches; kv_of[c]: head c's KV head; q / out: heads HD apart. HD a
 * multiple of RP_WIDTH, fixed per instantiation so the loops unroll into registers. */
RP_INLINE void attend_heads(const float *q, int64_t nh, const int64_t *kv_of,
                            const float *k_cache, const float *v_cache, const int64_t *rows,
                            int64_t len, float scale, float *scores, float *out,
                            const int HD) {
    const int V = HD / RP_WIDTH, C = V >= RP_ACC ? 1 : RP_ACC / V;   /* constants once inlined */
    const int DV = V <= RP_ACC ? V : V / ((V + RP_ACC - 1) / RP_ACC);
    for (int64_t t = 0; t < len; t++) {
        const float *kt = k_cache + rows[t];
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            if (c >= nh) break;
            const float *kh = kt + kv_of[c] * HD, *qh = q + c * HD;
            vf prod = vload(qh) * vload(kh);
#pragma GCC unroll 32
            for (int v = 1; v < V; v++)
                prod = vfma(vload(qh + RP_WIDTH * v), vload(kh + RP_WIDTH * v), prod);
            scores[c * len + t] = vsum(prod) * scale;
        }
    }
    float inv[RP_ACC];
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) inv[c] = c < nh ? 1.0f / softmax_numerators(scores + c * len, len) : 0.0f;
    for (int v0 = 0; v0 < V; v0 += DV) {
        vf acc[RP_ACC][RP_ACC];
#pragma GCC unroll 16
        for (int c = 0; c < C; c++)
#pragma GCC unroll 16
            for (int v = 0; v < DV; v++) acc[c][v] = (vf){0};
        for (int64_t t = 0; t < len; t++) {
            const float *vt = v_cache + rows[t] + RP_WIDTH * v0;
#pragma GCC unroll 16
            for (int c = 0; c < C; c++) {
                if (c >= nh) break;
                const vf p = vdup(scores[c * len + t]);
#pragma GCC unroll 16
                for (int v = 0; v < DV; v++)
                    acc[c][v] = vfma(p, vload(vt + kv_of[c] * HD + RP_WIDTH * v), acc[c][v]);
            }
        }
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            if (c >= nh) break;
#pragma GCC unroll 16
            for (int v = 0; v < DV; v++)
                vstore(out + c * HD + RP_WIDTH * (v0 + v), acc[c][v] * vdup(inv[c]));
        }
    }
}

#define ATTEND_HEADS(HD)                                                                 \
    static void attend_heads_##HD(const float *q, int64_t nh, const int64_t *kv_of,        \
                                  const float *kc, const float *vc, const int64_t *rows,   \
                                  int64_t len, float scale, float *scores, float *out) {   \
        attend_heads(q, nh, kv_of, kc, vc, rows, len, scale, scores, out, HD);            \
    }
ATTEND_HEADS(16)
ATTEND_HEADS(32)
ATTEND_HEADS(64)
ATTEND_HEADS(128)

/* Any other head size: one head at a time. */
static void attend_head(const float *q, int64_t d, const float *k_cache, const float *v_cache,
                        const int64_t *rows, int64_t len, float scale, float *scores,
                        float *out) {
    for (int64_t t = 0; t < len; t++) scores[t] = dot(q, k_cache + rows[t], d) * scale;
    const float total = softmax_numerators(scores, len);
    memset(out, 0, (size_t)d * sizeof(float));
    for (int64_t t = 0; t < len; t++)
        for (int64_t j = 0; j < d; j++) out[j] += scores[t] * v_cache[rows[t] + j];
    for (int64_t j = 0; j < d; j++) out[j] /= total;
}

/* out[h][d] of one sequence with `len` cached tokens at rows[t]: every head, in
 * register-sized groups of heads where an instantiation fits d */
void attend_sequence(const float *q, int64_t h, int64_t group, int64_t d,
                     const float *k_cache, const float *v_cache, const int64_t *rows,
                     int64_t len, float scale, float *scores, float *out) {
    if ((d == 16 || d == 32 || d == 64 || d == 128) && d % RP_WIDTH == 0) {
        const int64_t per = heads_per_pass(d);
        int64_t kv_of[RP_ACC];
        for (int64_t h0 = 0; h0 < h; h0 += per) {
            const int64_t nh = h - h0 < per ? h - h0 : per;
            for (int64_t c = 0; c < nh; c++) kv_of[c] = (h0 + c) / group;
            const float *qh = q + h0 * d;
            float *oh = out + h0 * d;
            if (d == 16) attend_heads_16(qh, nh, kv_of, k_cache, v_cache, rows, len, scale, scores, oh);
            else if (d == 32) attend_heads_32(qh, nh, kv_of, k_cache, v_cache, rows, len, scale, scores, oh);
            else if (d == 64) attend_heads_64(qh, nh, kv_of, k_cache, v_cache, rows, len, scale, scores, oh);
            else attend_heads_128(qh, nh, kv_of, k_cache, v_cache, rows, len, scale, scores, oh);
        }
        return;
    }
    for (int64_t head = 0; head < h; head++)
        attend_head(q + head * d, d, k_cache + (head / group) * d, v_cache + (head / group) * d,
                    rows, len, scale, scores, out + head * d);
}

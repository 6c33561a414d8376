/* roseplay's native CPU decode kernels, their entry points: skinny linears with the
 * norm / SiLU-mul fused into the read of their input (rp_linear), rotary + KV store +
 * paged decode attention in one pass (rp_decode_attention), and a whole Llama decoder
 * layer chaining them (rp_llama_decode_layer). Built at first use by
 * kernels/cpu_native_build.py (cc -O3 -march=native, with cpu_native_gemm.c,
 * cpu_native_attention.c and cpu_native_rows.c) and called through ctypes from
 * kernels/cpu_native.py; docs/KERNELS.md "CPU native" says why.
 *
 * Everything computes in float32, in vectors of the width the target has
 * (kernels/cpu_native_simd.h). Weights are packed by the caller into panels of 16
 * output columns, [N/16][K][16], stored in float16 or bfloat16 only when that dtype
 * holds every weight exactly (the bundled checkpoint is float16), so the products are
 * those of the float32 weights; only the summation order differs from torch's.
 * One thread: the engine process runs one torch thread on this 2-core target. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_native.h"
#include "cpu_native_simd.h"

int rp_abi_version(void) { return 4; }

/* floats per vector of the build: 16 with AVX-512, 8 with AVX2 + FMA + F16C, else 4
 * (the engine takes this backend by default from 8 up) */
int rp_vector_width(void) { return RP_WIDTH; }

static __thread scratch_t s_panel, s_row, s_rotated, s_scores, s_rows, s_layer;

float *scratch(scratch_t *s, size_t n) {
    if (n > s->len) {
        free(s->ptr);
        size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
        s->ptr = aligned_alloc(64, bytes);
        s->len = s->ptr ? n : 0;
    }
    return s->ptr;
}

/* y[m][n] = prologue(x)[m][k] . W^T + bias. x rows are ldx apart (in floats); for
 * IN_SILU_MUL a row holds 2k values [gate | up]. Returns 0, or -1 without memory. */
int rp_linear(const float *x, int64_t m, int64_t k, int64_t ldx, const void *w, int wdt,
              int64_t n, const float *bias, float *y, int64_t ldy, int mode,
              const float *norm_w, float eps, const float *res_in, int64_t ld_res_in,
              float *res_out, int64_t ld_res_out) {
    float *at = scratch(&s_panel, (size_t)k * ROWS);
    float *row = scratch(&s_row, (size_t)k);
    if (!at || !row) return -1;
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        int64_t rows = m - r0 < ROWS ? m - r0 : ROWS;
        pack_input(x + r0 * ldx, ldx, rows, k, mode, norm_w, eps,
                   res_in ? res_in + r0 * ld_res_in : NULL, ld_res_in,
                   res_out ? res_out + r0 * ld_res_out : NULL, ld_res_out, at, row);
        gemm(at, w, wdt, k, n, bias, y + r0 * ldy, ldy, rows);
    }
    return 0;
}

/* rows[t]: the cache offset (in floats) of token t's row, t < len, from the block table */
static void token_rows(const int32_t *table, int64_t block_size, int64_t row_stride,
                       int64_t len, int64_t *rows) {
    for (int64_t t0 = 0, i = 0; t0 < len; t0 += block_size, i++) {
        const int64_t base = (int64_t)table[i] * block_size * row_stride;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t j = 0; j < n; j++) rows[t0 + j] = base + j * row_stride;
    }
}

/* Every index the call will follow is inside its tensor: 0, else -2 (the caller
 * raises; a bad table must not become a wild read). */
static int check_indices(int64_t batch, const int64_t *positions, int64_t n_positions,
                         const int64_t *slots, int64_t num_blocks, int64_t block_size,
                         const int32_t *block_tables, int64_t ld_tables, int64_t table_width,
                         const int32_t *context_lens) {
    for (int64_t b = 0; b < batch; b++) {
        if (positions && (positions[b] < 0 || positions[b] >= n_positions)) return -2;
        if (slots && slots[b] >= num_blocks * block_size) return -2;
        int64_t len = context_lens[b];
        if (len > table_width * block_size) return -2;
        for (int64_t i = 0; i < (len + block_size - 1) / block_size; i++) {
            int32_t block = block_tables[b * ld_tables + i];
            if (block < 0 || block >= num_blocks) return -2;
        }
    }
    return 0;
}

/* One decode token per sequence b < batch. With cos_sin (rows of [cos | sin], width d):
 * rotate q and k at positions[b], store k and v at slots[b] (skipped when < 0), then
 * attend; without it q is attended as given and nothing is stored. Caches are
 * [num_blocks][block_size][h_kv][d]; q / k / v rows are ld* floats apart, heads d
 * apart. out [batch][h][d]; a sequence with no context gets zeros. Returns 0, -1 (no
 * memory) or -2 (an index out of range: nothing was written). */
int rp_decode_attention(int64_t batch, int64_t h, int64_t h_kv, int64_t d,
                        const float *q, int64_t ldq, const float *k, int64_t ldk,
                        const float *v, int64_t ldv, const int64_t *positions,
                        const float *cos_sin, int64_t n_positions, const int64_t *slots,
                        float *k_cache, float *v_cache, int64_t num_blocks,
                        int64_t block_size, const int32_t *block_tables, int64_t ld_tables,
                        int64_t table_width, const int32_t *context_lens, float scale,
                        float *out) {
    const int64_t group = h / h_kv, row_stride = h_kv * d;
    if (check_indices(batch, cos_sin ? positions : NULL, n_positions, cos_sin ? slots : NULL,
                      num_blocks, block_size, block_tables, ld_tables, table_width,
                      context_lens))
        return -2;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = context_lens[b] > longest ? context_lens[b] : longest;
    float *qr = scratch(&s_rotated, (size_t)(h + h_kv) * d);
    float *scores = scratch(&s_scores, (size_t)(longest * RP_ACC));
    int64_t *rows = (int64_t *)scratch(&s_rows, (size_t)longest * 2);
    if (!qr || !scores || !rows) return -1;
#if defined(__SSE__)
    /* the tiny probabilities of a peaked softmax times the values are subnormal, and
     * subnormal arithmetic costs a microcode assist each: flush them to zero until the
     * return (the caller's thread keeps its own mode) */
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);                   /* FTZ | DAZ */
#endif
    for (int64_t b = 0; b < batch; b++) {
        const float *qb = q + b * ldq;
        if (cos_sin) {
            const float *cs = cos_sin + positions[b] * d;
            for (int64_t head = 0; head < h; head++) rotate_half(qb + head * d, cs, d, qr + head * d);
            float *kr = qr + h * d;
            for (int64_t head = 0; head < h_kv; head++)
                rotate_half(k + b * ldk + head * d, cs, d, kr + head * d);
            if (slots[b] >= 0) {
                memcpy(k_cache + slots[b] * row_stride, kr, (size_t)row_stride * sizeof(float));
                memcpy(v_cache + slots[b] * row_stride, v + b * ldv, (size_t)row_stride * sizeof(float));
            }
            qb = qr;
        }
        const int64_t len = context_lens[b];
        if (len <= 0) {
            memset(out + b * h * d, 0, (size_t)(h * d) * sizeof(float));
            continue;
        }
        token_rows(block_tables + b * ld_tables, block_size, row_stride, len, rows);
        attend_sequence(qb, h, group, d, k_cache, v_cache, rows, len, scale,
                        scores, out + b * h * d);
    }
#if defined(__SSE__)
    _mm_setcsr(csr);
#endif
    return 0;
}

/* out, res_out [t][hs] = the layer applied to hidden (+ res_in), chaining the calls above
 * through thread-local scratch: RMSNorm + qkv, rotary + KV store + attention, o, the
 * residual add + RMSNorm + gate|up, SiLU-mul + down. One call a layer instead of five
 * from Python (their argument checks and tensors cost as much as the attention).
 * res_in may be NULL (the first layer: the residual is hidden itself). Weights: packed
 * panels with their dtype codes; biases may be NULL. Returns 0, -1 or -2 as
 * rp_decode_attention (on -2 no cache was written). */
int rp_llama_decode_layer(int64_t t, int64_t hs, const float *hidden, const float *res_in,
                          float *res_out, float *out, float eps, const float *norm1,
                          const float *norm2, const void *w_qkv, int dt_qkv, const float *b_qkv,
                          const void *w_o, int dt_o, const float *b_o, const void *w_gu,
                          int dt_gu, const float *b_gu, int64_t inter, const void *w_down,
                          int dt_down, const float *b_down, int64_t h, int64_t h_kv, int64_t d,
                          const int64_t *positions, const float *cos_sin, int64_t n_positions,
                          const int64_t *slots, float *k_cache, float *v_cache,
                          int64_t num_blocks, int64_t block_size, const int32_t *block_tables,
                          int64_t ld_tables, int64_t table_width, const int32_t *context_lens,
                          float scale) {
    const int64_t n_qkv = (h + 2 * h_kv) * d;
    float *qkv = scratch(&s_layer, (size_t)(t * (n_qkv + h * d + hs + 2 * inter)));
    if (!qkv) return -1;
    float *attn = qkv + t * n_qkv, *o = attn + t * h * d, *gate_up = o + t * hs;
    int status = rp_linear(hidden, t, hs, hs, w_qkv, dt_qkv, n_qkv, b_qkv, qkv, n_qkv,
                           IN_RMS_NORM, norm1, eps, res_in, hs, res_out, hs);
    if (status) return status;
    status = rp_decode_attention(t, h, h_kv, d, qkv, n_qkv, qkv + h * d, n_qkv,
                                 qkv + (h + h_kv) * d, n_qkv, positions, cos_sin, n_positions,
                                 slots, k_cache, v_cache, num_blocks, block_size, block_tables,
                                 ld_tables, table_width, context_lens, scale, attn);
    if (status) return status;
    status = rp_linear(attn, t, h * d, h * d, w_o, dt_o, hs, b_o, o, hs, IN_PLAIN, NULL, 0.0f,
                       NULL, 0, NULL, 0);
    if (status) return status;
    status = rp_linear(o, t, hs, hs, w_gu, dt_gu, 2 * inter, b_gu, gate_up, 2 * inter,
                       IN_RMS_NORM, norm2, eps, res_out, hs, res_out, hs);
    if (status) return status;
    return rp_linear(gate_up, t, inter, 2 * inter, w_down, dt_down, hs, b_down, out, hs,
                     IN_SILU_MUL, NULL, 0.0f, NULL, 0, NULL, 0);
}

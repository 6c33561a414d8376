/* roseplay's native CPU decode kernels: skinny linears with the norm / SiLU-mul fused
 * into the read of their input, and rotary + KV store + paged decode attention in one
 * pass. Built at first use by kernels/cpu_native_build.py (cc -O3 -march=native) and
 * called through ctypes from kernels/cpu_native.py; docs/KERNELS.md "CPU native" says why.
 *
 * Everything computes in float32. Weights are packed by the caller into panels of 16
 * output columns, [N/16][K][16], stored in float16 or bfloat16 only when that dtype
 * holds every weight exactly (the bundled checkpoint is float16), so the products are
 * those of the float32 weights; only the summation order differs from torch's.
 * One thread: the engine process runs one torch thread on this 2-core target. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__SSE__)
#include <immintrin.h>
#endif

enum { W_F32 = 0, W_F16 = 1, W_BF16 = 2 };
enum { IN_PLAIN = 0, IN_RMS_NORM = 1, IN_SILU_MUL = 2 };
#define PANEL 16            /* output columns of one packed weight panel */
#define ROWS 16             /* input rows one pass over the weights serves */

int rp_abi_version(void) { return 3; }

/* floats per vector of the build's fast paths: 16 with AVX-512, 1 for the portable loops
 * (the engine takes this backend by default only when it is 16) */
int rp_vector_width(void) {
#if defined(__AVX512F__)
    return 16;
#else
    return 1;
#endif
}

/* one thread-local scratch buffer per use, grown on demand (never shrunk) */
typedef struct { float *ptr; size_t len; } scratch_t;
static __thread scratch_t s_panel, s_row, s_scores, s_rows;

static float *scratch(scratch_t *s, size_t n) {
    if (n > s->len) {
        free(s->ptr);
        size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
        s->ptr = aligned_alloc(64, bytes);
        s->len = s->ptr ? n : 0;
    }
    return s->ptr;
}

/* ---- exp and the row prologues ------------------------------------------------- */
#if defined(__AVX512F__)
/* e^x to ~1 ulp (Cephes' polynomial on x - n ln2, scaled by 2^n) */
static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

static float sum_squares(const float *x, int64_t k) {
    int64_t i = 0;
    float total = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= k; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    total = _mm512_reduce_add_ps(acc);
#endif
    for (; i < k; i++) total += x[i] * x[i];
    return total;
}

/* silu(gate) * up into out[k] */
static void silu_mul_row(const float *gate, const float *up, float *out, int64_t k) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= k; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i < k; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* The linear's input rows [row0, row0 + rows) as the transposed panel at[k][ROWS]
 * (rows past `rows` are zeros), after the prologue: plain, RMSNorm (of x + res_in,
 * whose sum goes to res_out), or SiLU-mul of x = [gate | up]. */
static void pack_input(const float *x, int64_t ldx, int64_t rows, int64_t k, int mode,
                       const float *norm_w, float eps, const float *res_in, int64_t ld_res_in,
                       float *res_out, int64_t ld_res_out, float *at, float *row) {
    memset(at, 0, (size_t)k * ROWS * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        const float *src = xr;
        if (mode == IN_RMS_NORM) {
            if (res_in) {
                const float *rr = res_in + r * ld_res_in;
                for (int64_t i = 0; i < k; i++) row[i] = xr[i] + rr[i];
                src = row;
            }
            if (res_out) memcpy(res_out + r * ld_res_out, src, (size_t)k * sizeof(float));
            float scale = 1.0f / sqrtf(sum_squares(src, k) / (float)k + eps);
            for (int64_t i = 0; i < k; i++) row[i] = src[i] * scale * norm_w[i];
            src = row;
        } else if (mode == IN_SILU_MUL) {
            silu_mul_row(xr, xr + k, row, k);
            src = row;
        }
        for (int64_t i = 0; i < k; i++) at[i * ROWS + r] = src[i];
    }
}

/* ---- the skinny GEMM: out[rows][n] = A[rows][k] . W[n][k]^T + bias -------------- */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 load_w(const void *w, int64_t at, int wdt) {
    if (wdt == W_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at)));
    if (wdt == W_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at))), 16));
    return _mm512_loadu_ps((const float *)w + at);
}

/* RM rows x NP panels of accumulators (at most 16 registers), one pass over k */
static inline __attribute__((always_inline)) void tile(
        const float *at, const void *w, int64_t k, int64_t panel, int RM, int NP, int wdt, const float *bias, float *out, int64_t ldo, int64_t rows,
        int64_t n) {
    __m512 acc[16][4];
#pragma GCC unroll 16
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) b[p] = load_w(w, ((panel + p) * k + kk) * PANEL, wdt);
        const float *a = at + kk * ROWS;
#pragma GCC unroll 16
        for (int r = 0; r < RM; r++) {
            __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(av, b[p], acc[r][p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
        int64_t col = (panel + p) * PANEL;
        int64_t left = n - col;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int r = 0; r < RM; r++)
            if (r < rows) _mm512_mask_storeu_ps(out + r * ldo + col, m, _mm512_add_ps(acc[r][p], bv));
    }
}

#define TILES(WDT)                                                                      \
    static void gemm_##WDT(const float *at, const void *w, int64_t k, int64_t n,       \
                           const float *bias, float *out, int64_t ldo, int64_t rows) { \
        int64_t panels = (n + PANEL - 1) / PANEL, p = 0;                               \
        if (rows <= 4) {                                                               \
            for (; p + 4 <= panels; p += 4)                                            \
                tile(at, w, k, p, 4, 4, WDT, bias, out, ldo, rows, n);         \
            for (; p < panels; p++)                                                    \
                tile(at, w, k, p, 4, 1, WDT, bias, out, ldo, rows, n);         \
        } else if (rows <= 8) {                                                        \
            for (; p + 2 <= panels; p += 2)                                            \
                tile(at, w, k, p, 8, 2, WDT, bias, out, ldo, rows, n);         \
            for (; p < panels; p++)                                                    \
                tile(at, w, k, p, 8, 1, WDT, bias, out, ldo, rows, n);         \
        } else {                                                                       \
            for (; p < panels; p++)                                                    \
                tile(at, w, k, p, 16, 1, WDT, bias, out, ldo, rows, n);        \
        }                                                                              \
    }
TILES(W_F32)
TILES(W_F16)
TILES(W_BF16)

static void gemm(const float *at, const void *w, int wdt, int64_t k, int64_t n,
                 const float *bias, float *out, int64_t ldo, int64_t rows) {
    if (wdt == W_F16) gemm_W_F16(at, w, k, n, bias, out, ldo, rows);
    else if (wdt == W_BF16) gemm_W_BF16(at, w, k, n, bias, out, ldo, rows);
    else gemm_W_F32(at, w, k, n, bias, out, ldo, rows);
}
#else
static float weight_at(const void *w, int wdt, int64_t i) {
    if (wdt == W_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    if (wdt == W_BF16) {
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    _Float16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#endif
}

/* the portable loops: one output at a time */
static void gemm(const float *at, const void *w, int wdt, int64_t k, int64_t n,
                 const float *bias, float *out, int64_t ldo, int64_t rows) {
    for (int64_t col = 0; col < n; col++) {
        const int64_t base = (col / PANEL) * k * PANEL + col % PANEL;
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < k; kk++)
                acc += at[kk * ROWS + r] * weight_at(w, wdt, base + kk * PANEL);
            out[r * ldo + col] = acc + (bias ? bias[col] : 0.0f);
        }
    }
}
#endif

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

/* ---- rotary + KV store + paged decode attention ---------------------------------- */
/* rotate-half (Neox / Llama) rotary of one head, cos | sin halves in cs[d] */
static void rotate_half(const float *x, const float *cs, int64_t d, float *out) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half], c = cs[i], s = cs[half + i];
        out[i] = x1 * c - x2 * s;
        out[i + half] = x2 * c + x1 * s;
    }
}

static float dot(const float *a, const float *b, int64_t d) {
    int64_t i = 0;
    float total = 0.0f;
#if defined(__AVX512F__)
    if (d % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (; i < d; i += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return _mm512_reduce_add_ps(acc);
    }
#endif
    for (; i < d; i++) total += a[i] * b[i];
    return total;
}

/* probs[i] = exp(s[i] - max) in place, returns their sum */
static float softmax_numerators(float *s, int64_t len) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < len; i++) mx = s[i] > mx ? s[i] : mx;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps(), vmx = _mm512_set1_ps(mx);
    for (; i + 16 <= len; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmx));
        _mm512_storeu_ps(s + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < len) {                      /* the tail, masked: no scalar expf per element */
        const __mmask16 m = (__mmask16)((1u << (len - i)) - 1u);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vmx));
        _mm512_mask_storeu_ps(s + i, m, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
        i = len;
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; i < len; i++) {
        s[i] = expf(s[i] - mx);
        sum += s[i];
    }
    return sum;
}

#if defined(__AVX512F__)
/* The heads [0, nh) of one sequence (at most 256 / HD of them: their value accumulators
 * fill 16 registers) against its cached keys and values, each token's row of all KV
 * heads read once per pass: scores (scale * q . k_t), softmax per head, then the
 * probability-weighted values. rows[t]: token t's row offset in the caches; kv_of[c]:
 * head c's KV head; q / out: heads HD apart. HD a multiple of 16, fixed per
 * instantiation so the loops unroll into registers. */
static inline __attribute__((always_inline)) void attend_heads(
        const float *q, int64_t nh, const int64_t *kv_of, const float *k_cache,
        const float *v_cache, const int64_t *rows, int64_t len, float scale, float *scores,
        float *out, const int HD) {
    const int C = 256 / HD, V = HD / 16;         /* constants once inlined */
    __m512 acc[16][8];
    for (int64_t t = 0; t < len; t++) {
        const float *kt = k_cache + rows[t];
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            if (c >= nh) break;
            const float *kh = kt + kv_of[c] * HD, *qh = q + c * HD;
            __m512 prod = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(kh));
#pragma GCC unroll 8
            for (int v = 1; v < V; v++)
                prod = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * v), _mm512_loadu_ps(kh + 16 * v), prod);
            scores[c * len + t] = _mm512_reduce_add_ps(prod) * scale;
        }
    }
    float inv[16];
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        inv[c] = c < nh ? 1.0f / softmax_numerators(scores + c * len, len) : 0.0f;
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) acc[c][v] = _mm512_setzero_ps();
    }
    for (int64_t t = 0; t < len; t++) {
        const float *vt = v_cache + rows[t];
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            if (c >= nh) break;
            __m512 p = _mm512_set1_ps(scores[c * len + t]);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[c][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt + kv_of[c] * HD + 16 * v), acc[c][v]);
        }
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        if (c >= nh) break;
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm512_storeu_ps(out + c * HD + 16 * v, _mm512_mul_ps(acc[c][v], _mm512_set1_ps(inv[c])));
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
#endif

/* The portable path: one head at a time (d any size). */
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
 * register-sized groups of heads where an AVX-512 instantiation fits d */
static void attend_sequence(const float *q, int64_t h, int64_t group, int64_t d,
                            const float *k_cache, const float *v_cache, const int64_t *rows,
                            int64_t len, float scale, float *scores, float *out) {
#if defined(__AVX512F__)
    if (d == 16 || d == 32 || d == 64 || d == 128) {
        const int64_t per = 256 / d;
        int64_t kv_of[16];
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
#endif
    for (int64_t head = 0; head < h; head++)
        attend_head(q + head * d, d, k_cache + (head / group) * d, v_cache + (head / group) * d,
                    rows, len, scale, scores, out + head * d);
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
#if defined(__AVX512F__) || defined(__SSE__)
    /* the tiny probabilities of a peaked softmax times the values are subnormal, and
     * subnormal arithmetic costs a microcode assist each: flush them to zero here */
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);                   /* FTZ | DAZ */
#endif
    float *qr = scratch(&s_row, (size_t)(h + h_kv) * d);
    float *scores = scratch(&s_scores, (size_t)(longest * 16));
    int64_t *rows = (int64_t *)scratch(&s_rows, (size_t)longest * 2);
    if (!qr || !scores || !rows) return -1;
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
#if defined(__AVX512F__) || defined(__SSE__)
    _mm_setcsr(csr);
#endif
    return 0;
}

/* ---- one whole Llama decoder layer for a decode-only step ------------------------- */
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
    static __thread scratch_t s_layer;
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

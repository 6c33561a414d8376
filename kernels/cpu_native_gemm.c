/* The skinny GEMM of the native CPU kernels: out[rows][n] = A[rows][k] . W[n][k]^T + bias
 * for rows <= ROWS, A given transposed (at[k][ROWS], kernels/cpu_native_rows.c), W packed
 * in panels of PANEL output columns, [N/PANEL][K][PANEL], in float32, float16 or
 * bfloat16 (converted exactly as loaded). Register tiles of RM rows x NV vectors of
 * columns, one pass over k each; their shapes per vector width are the only thing the
 * widths do not share. */
#include "cpu_native.h"
#include "cpu_native_simd.h"

/* Tile shapes (rows, vectors) for up to S_RM rows, up to M_RM, and the rest in groups
 * of B_RM rows: RM * NV accumulators within RP_ACC, and the more columns a tile spans
 * the fewer passes the small row counts make over the weights. */
#if RP_WIDTH == 16
enum { S_RM = 4, S_NV = 4, M_RM = 8, M_NV = 2, B_RM = 16, B_NV = 1 };
#elif RP_WIDTH == 8
enum { S_RM = 2, S_NV = 4, M_RM = 4, M_NV = 3, B_RM = 6, B_NV = 2 };
#else
enum { S_RM = 2, S_NV = 4, M_RM = 4, M_NV = 2, B_RM = 8, B_NV = 1 };
#endif
#define MAX_RM 16
#define MAX_NV 4
#define VPP (PANEL / RP_WIDTH)          /* vectors per panel */

RP_INLINE vf load_w(const void *w, int64_t at, int wdt) {
    if (wdt == W_F16) return vload_f16((const uint16_t *)w + at);
    if (wdt == W_BF16) return vload_bf16((const uint16_t *)w + at);
    return vload((const float *)w + at);
}

/* rows [0, RM) (those < rows stored) x the NV column vectors from vector v0 */
RP_INLINE void tile(const float *at, const void *w, int64_t k, int64_t v0, int RM, int NV,
                    int wdt, const float *bias, float *out, int64_t ldo, int64_t rows,
                    int64_t n) {
    vf acc[MAX_RM][MAX_NV];
    int64_t base[MAX_NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
        const int64_t col = (v0 + j) * RP_WIDTH;
        base[j] = (col / PANEL) * k * PANEL + col % PANEL;
    }
#pragma GCC unroll 16
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = (vf){0};
    for (int64_t kk = 0; kk < k; kk++) {
        vf b[MAX_NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) b[j] = load_w(w, base[j] + kk * PANEL, wdt);
        const float *a = at + kk * ROWS;
#pragma GCC unroll 16
        for (int r = 0; r < RM; r++) {
            const vf av = vdup(a[r]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = vfma(av, b[j], acc[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
        const int64_t col = (v0 + j) * RP_WIDTH, left = n - col;
        if (left <= 0) break;
        vf bv = {0};
        if (bias) bv = left >= RP_WIDTH ? vload(bias + col) : vload_n(bias + col, left);
#pragma GCC unroll 16
        for (int r = 0; r < RM; r++) {
            if (r >= rows) break;
            if (left >= RP_WIDTH) vstore(out + r * ldo + col, acc[r][j] + bv);
            else vstore_n(out + r * ldo + col, acc[r][j] + bv, left);
        }
    }
}

/* every column vector of rows [0, min(rows, RM)): tiles of NV vectors, then single ones */
#define SWEEP(RM, NV, WDT)                                                              \
    do {                                                                                \
        int64_t v = 0;                                                                  \
        for (; v + (NV) <= nvec; v += (NV))                                             \
            tile(at, w, k, v, RM, NV, WDT, bias, out, ldo, rows, n);                    \
        for (; v < nvec; v++) tile(at, w, k, v, RM, 1, WDT, bias, out, ldo, rows, n);   \
    } while (0)

/* rows in groups of at most B_RM, each group's tile shape by its row count */
#define GEMM(WDT)                                                                       \
    static void gemm_##WDT(const float *at, const void *w, int64_t k, int64_t n,       \
                           const float *bias, float *out, int64_t ldo, int64_t rows) { \
        const int64_t nvec = (n + PANEL - 1) / PANEL * VPP;                            \
        for (; rows > 0; rows -= B_RM, at += B_RM, out += B_RM * ldo) {                \
            if (rows <= S_RM) SWEEP(S_RM, S_NV, WDT);                                  \
            else if (rows <= M_RM) SWEEP(M_RM, M_NV, WDT);                             \
            else SWEEP(B_RM, B_NV, WDT);                                               \
        }                                                                              \
    }
GEMM(W_F32)
GEMM(W_F16)
GEMM(W_BF16)

void gemm(const float *at, const void *w, int wdt, int64_t k, int64_t n, const float *bias,
          float *out, int64_t ldo, int64_t rows) {
    if (wdt == W_F16) gemm_W_F16(at, w, k, n, bias, out, ldo, rows);
    else if (wdt == W_BF16) gemm_W_BF16(at, w, k, n, bias, out, ldo, rows);
    else gemm_W_F32(at, w, k, n, bias, out, ldo, rows);
}

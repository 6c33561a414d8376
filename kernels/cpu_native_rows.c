/* Row-wise work around the native CPU kernels' GEMM and attention: the linears' input
 * prologues (RMSNorm with the residual add, SiLU(gate) * up) and rotate-half rotary. */
#include <math.h>
#include <string.h>

#include "cpu_native.h"
#include "cpu_native_simd.h"

static float sum_squares(const float *x, int64_t k) {
    int64_t i = 0;
    vf acc = {0};
    for (; i + RP_WIDTH <= k; i += RP_WIDTH) {
        vf v = vload(x + i);
        acc = vfma(v, v, acc);
    }
    float total = vsum(acc);
    for (; i < k; i++) total += x[i] * x[i];
    return total;
}

/* silu(gate) * up into out[k] */
static void silu_mul_row(const float *gate, const float *up, float *out, int64_t k) {
    int64_t i = 0;
    for (; i + RP_WIDTH <= k; i += RP_WIDTH) {
        vf g = vload(gate + i);
        vstore(out + i, g / (vdup(1.0f) + vexp(-g)) * vload(up + i));
    }
    if (i < k) {                        /* the tail through the same exp */
        vf g = vload_n(gate + i, k - i);
        vstore_n(out + i, g / (vdup(1.0f) + vexp(-g)) * vload_n(up + i, k - i), k - i);
    }
}

/* The linear's input rows [row0, row0 + rows) as the transposed panel at[k][ROWS]
 * (rows past `rows` are zeros), after the prologue: plain, RMSNorm (of x + res_in,
 * whose sum goes to res_out), or SiLU-mul of x = [gate | up]. */
void pack_input(const float *x, int64_t ldx, int64_t rows, int64_t k, int mode,
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

/* rotate-half (Neox / Llama) rotary of one head, cos | sin halves in cs[d] */
void rotate_half(const float *x, const float *cs, int64_t d, float *out) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half], c = cs[i], s = cs[half + i];
        out[i] = x1 * c - x2 * s;
        out[i + half] = x2 * c + x1 * s;
    }
}

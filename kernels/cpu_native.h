/* What the native CPU kernels' files share: the weight and prologue codes, the panel
 * shapes, the thread-local scratch buffers and the functions one file calls in another.
 * Only the rp_* entry points (RP_EXPORT) are visible outside the library; the build
 * compiles with -fvisibility=hidden. */
#ifndef RP_CPU_NATIVE_H
#define RP_CPU_NATIVE_H
#include <stddef.h>
#include <stdint.h>

#define RP_EXPORT __attribute__((visibility("default")))

enum { W_F32 = 0, W_F16 = 1, W_BF16 = 2 };
enum { IN_PLAIN = 0, IN_RMS_NORM = 1, IN_SILU_MUL = 2 };
#define PANEL 16            /* output columns of one packed weight panel */
#define ROWS 16             /* input rows one pass over the weights serves */

/* a buffer grown on demand (never shrunk); each use has its own, thread-local */
typedef struct { float *ptr; size_t len; } scratch_t;
float *scratch(scratch_t *s, size_t n);

/* cpu_native_rows.c: the linears' input prologues and rotary */
void pack_input(const float *x, int64_t ldx, int64_t rows, int64_t k, int mode,
                const float *norm_w, float eps, const float *res_in, int64_t ld_res_in,
                float *res_out, int64_t ld_res_out, float *at, float *row);
void rotate_half(const float *x, const float *cs, int64_t d, float *out);

/* cpu_native_gemm.c: out[rows][n] = at^T . W^T + bias, at the transposed input panel */
void gemm(const float *at, const void *w, int wdt, int64_t k, int64_t n,
          const float *bias, float *out, int64_t ldo, int64_t rows);

/* cpu_native_attention.c: one sequence's heads against its cached rows */
void attend_sequence(const float *q, int64_t h, int64_t group, int64_t d,
                     const float *k_cache, const float *v_cache, const int64_t *rows,
                     int64_t len, float scale, float *scores, float *out);
int64_t heads_per_pass(int64_t d);

/* the entry points (kernels/cpu_native_build.py binds them) */
RP_EXPORT int rp_abi_version(void);
RP_EXPORT int rp_vector_width(void);
RP_EXPORT int rp_linear(const float *x, int64_t m, int64_t k, int64_t ldx, const void *w,
                        int wdt, int64_t n, const float *bias, float *y, int64_t ldy,
                        int mode, const float *norm_w, float eps, const float *res_in,
                        int64_t ld_res_in, float *res_out, int64_t ld_res_out);
RP_EXPORT int rp_decode_attention(int64_t batch, int64_t h, int64_t h_kv, int64_t d,
                                  const float *q, int64_t ldq, const float *k, int64_t ldk,
                                  const float *v, int64_t ldv, const int64_t *positions,
                                  const float *cos_sin, int64_t n_positions,
                                  const int64_t *slots, float *k_cache, float *v_cache,
                                  int64_t num_blocks, int64_t block_size,
                                  const int32_t *block_tables, int64_t ld_tables,
                                  int64_t table_width, const int32_t *context_lens,
                                  float scale, float *out);
RP_EXPORT int rp_llama_decode_layer(
    int64_t t, int64_t hs, const float *hidden, const float *res_in, float *res_out,
    float *out, float eps, const float *norm1, const float *norm2, const void *w_qkv,
    int dt_qkv, const float *b_qkv, const void *w_o, int dt_o, const float *b_o,
    const void *w_gu, int dt_gu, const float *b_gu, int64_t inter, const void *w_down,
    int dt_down, const float *b_down, int64_t h, int64_t h_kv, int64_t d,
    const int64_t *positions, const float *cos_sin, int64_t n_positions,
    const int64_t *slots, float *k_cache, float *v_cache, int64_t num_blocks,
    int64_t block_size, const int32_t *block_tables, int64_t ld_tables,
    int64_t table_width, const int32_t *context_lens, float scale);

#endif

/* The vector type every loop of the native CPU kernels is written in, and the few
 * operations that take an instruction set's own instruction.
 *
 * vf is a GCC / Clang vector of RP_WIDTH floats; the loops use its operators and the
 * helpers below, so one source serves every width. RP_WIDTH follows the build's target
 * (-march=native): 16 with AVX-512, 8 with AVX2 + FMA + F16C, else 4 (SSE, NEON, or
 * scalar code the compiler makes of it). The helpers have AVX-512 and AVX2 versions
 * where an intrinsic does the job in one or a few instructions (broadcast, FMA, float16
 * and bfloat16 loads, min / max, the horizontal sum); elsewhere, and for a width the target has no registers for, the
 * generic versions compute the same values. RP_WIDTH may be set with -D: a build that
 * runs another target's width on this CPU (tests/kernels/test_cpu_native_widths.py). */
#ifndef RP_SIMD_H
#define RP_SIMD_H
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#ifndef RP_WIDTH
#if defined(__AVX512F__)
#define RP_WIDTH 16
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RP_WIDTH 8
#else
#define RP_WIDTH 4
#endif
#endif

#if RP_WIDTH == 16 && defined(__AVX512F__)
#define RP_AVX512 1
#elif RP_WIDTH == 8 && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RP_AVX2 1
#endif

/* How many accumulator vectors a register tile holds: half of AVX-512's 32 registers,
 * 12 of AVX2's 16 (the rest hold the weights and the broadcast input), 8 otherwise. */
#if RP_WIDTH == 16
#define RP_ACC 16
#elif RP_WIDTH == 8
#define RP_ACC 12
#else
#define RP_ACC 8
#endif

#define RP_INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(RP_WIDTH * 4)));
typedef int32_t vi __attribute__((vector_size(RP_WIDTH * 4)));
typedef uint32_t vu __attribute__((vector_size(RP_WIDTH * 4)));
typedef uint16_t vh __attribute__((vector_size(RP_WIDTH * 2)));

RP_INLINE vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
RP_INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* s in every lane */
RP_INLINE vf vdup(float s) {
#if defined(RP_AVX512)
    return _mm512_set1_ps(s);
#elif defined(RP_AVX2)
    return _mm256_set1_ps(s);
#else
    vf v;
    for (int i = 0; i < RP_WIDTH; i++) v[i] = s;
    return v;
#endif
}

/* vload_n / vstore_n through memory; out of line, so that the vector they take the
 * address of never pins a register tile's accumulators to the stack */
static __attribute__((noinline, unused)) vf vload_n_generic(const float *p, int64_t n) {
    vf v = {0};
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}
static __attribute__((noinline, unused)) void vstore_n_generic(float *p, vf v, int64_t n) {
    memcpy(p, &v, (size_t)n * sizeof(float));
}

/* lane i holds i */
RP_INLINE vi viota(void) {
    vi v;
    for (int i = 0; i < RP_WIDTH; i++) v[i] = i;
    return v;
}

/* the first n < RP_WIDTH floats at p, the other lanes zeros; nothing past them is read */
RP_INLINE vf vload_n(const float *p, int64_t n) {
#if defined(RP_AVX512)
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif defined(RP_AVX2)
    return _mm256_maskload_ps(p, (__m256i)(viota() < (vi){0} + (int32_t)n));
#else
    return vload_n_generic(p, n);
#endif
}

/* the first n < RP_WIDTH lanes of v stored at p */
RP_INLINE void vstore_n(float *p, vf v, int64_t n) {
#if defined(RP_AVX512)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
#elif defined(RP_AVX2)
    _mm256_maskstore_ps(p, (__m256i)(viota() < (vi){0} + (int32_t)n), v);
#else
    vstore_n_generic(p, v, n);
#endif
}

/* a * b + c, rounded once where the target has FMA */
RP_INLINE vf vfma(vf a, vf b, vf c) {
#if defined(RP_AVX512)
    return _mm512_fmadd_ps(a, b, c);
#elif defined(RP_AVX2)
    return _mm256_fmadd_ps(a, b, c);
#else
    return a * b + c;
#endif
}

/* max(x, lo) and min(x, hi) as maxps / minps: a NaN x gives the bound */
RP_INLINE vf vmax(vf x, vf lo) {
#if defined(RP_AVX512)
    return _mm512_max_ps(x, lo);
#elif defined(RP_AVX2)
    return _mm256_max_ps(x, lo);
#else
    vi gt = x > lo;
    return (vf)((gt & (vi)x) | (~gt & (vi)lo));
#endif
}

RP_INLINE vf vmin(vf x, vf hi) {
#if defined(RP_AVX512)
    return _mm512_min_ps(x, hi);
#elif defined(RP_AVX2)
    return _mm256_min_ps(x, hi);
#else
    vi lt = x < hi;
    return (vf)((lt & (vi)x) | (~lt & (vi)hi));
#endif
}

/* the sum of the lanes, halving the vector each step */
RP_INLINE float vsum(vf v) {
#if defined(RP_AVX512)
    return _mm512_reduce_add_ps(v);
#elif defined(RP_AVX2)
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
#else
    float t[RP_WIDTH];
    memcpy(t, &v, sizeof t);
    for (int half = RP_WIDTH / 2; half > 0; half /= 2)
        for (int i = 0; i < half; i++) t[i] += t[i + half];
    return t[0];
#endif
}

/* float16 -> float32, exact */
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    _Float16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#endif
}

/* RP_WIDTH float16 values at p, as float32 (exact) */
RP_INLINE vf vload_f16(const uint16_t *p) {
#if defined(RP_AVX512)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(RP_AVX2)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vf v;
    for (int i = 0; i < RP_WIDTH; i++) v[i] = half_to_float(p[i]);
    return v;
#endif
}

/* RP_WIDTH bfloat16 values at p, as float32: their bits are a float32's top half */
RP_INLINE vf vload_bf16(const uint16_t *p) {
#if defined(RP_AVX512)
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#elif defined(RP_AVX2)
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#else
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
#endif
}

/* e^x to ~1 ulp: Cephes' polynomial on r = x - n ln2, scaled by 2^n. x is clamped to
 * [-87.34, 88.72] (n in [-126, 128]); 2^n is applied as two normal factors, so the one
 * rounding is that of the final product, as AVX-512's scalef would give. */
RP_INLINE vf vexp(vf x) {
    x = vmin(vmax(x, vdup(-87.33654f)), vdup(88.72283f));
    const vf magic = vdup(12582912.0f);          /* 1.5 * 2^23: adding it rounds to an integer */
    vf n = (x * vdup(1.44269504088896341f) + magic) - magic;
    vf r = vfma(n, vdup(-0.693359375f), x);
    r = vfma(n, vdup(2.12194440e-4f), r);
    vf p = vdup(1.9875691500e-4f);
    p = vfma(p, r, vdup(1.3981999507e-3f));
    p = vfma(p, r, vdup(8.3334519073e-3f));
    p = vfma(p, r, vdup(4.1665795894e-2f));
    p = vfma(p, r, vdup(1.6666665459e-1f));
    p = vfma(p, r, vdup(5.0000001201e-1f));
    p = vfma(p * r, r, r + vdup(1.0f));
    vi e = __builtin_convertvector(n, vi), half = e >> 1;
    return p * (vf)((half + 127) << 23) * (vf)((e - half + 127) << 23);
}

#endif

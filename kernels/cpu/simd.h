/* SIMD helpers shared by the CPU kernels: `vf`, a vector of 16 floats, so that each kernel
 * is written once for two instruction sets.
 *
 *   FLEET_AVX512  AVX-512 F and BW: vf is one zmm register.
 *   FLEET_AVX2    AVX2 with FMA and F16C (AMD Zen 1-3, Intel before Skylake-SP): vf is two
 *                 ymm registers; every operation is the same per 8-lane half.
 *
 * FLEET_SIMD is set when either is; without it the kernels keep their portable loops (or
 * report that they do not run). Both are chosen at build time (-march=native).
 */
#ifndef FLEET_SIMD_H
#define FLEET_SIMD_H
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define FLEET_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FLEET_AVX2 1
#endif

#if defined(FLEET_AVX512) || defined(FLEET_AVX2)
#define FLEET_SIMD 1
#include <immintrin.h>
#define AI static inline __attribute__((always_inline))

#if defined(FLEET_AVX512)

typedef __m512 vf;
/* Keeps a loaded vector in a register: gcc otherwise folds the load into every FMA that
 * uses it, one load per use. */
#define VF_IN_REG(x) __asm__("" : "+v"(x))
AI vf vf_zero(void) { return _mm512_setzero_ps(); }
AI vf vf_set1(float a) { return _mm512_set1_ps(a); }
AI vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
AI void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
AI vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
AI vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
AI vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
AI vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
AI vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
AI vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
AI vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
AI float vf_sum(vf a) { return _mm512_reduce_add_ps(a); }
AI float vf_hmax(vf a) { return _mm512_reduce_max_ps(a); }
AI float vf_first(vf a) { return _mm512_cvtss_f32(a); }   /* lane 0 */
/* A lane mask, the lanes below n set (vm_first); vf_keep takes a's lanes where it is set,
 * fill's elsewhere. */
typedef __mmask16 vm;
AI vm vm_first(int n) { return n <= 0 ? 0 : n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u); }
AI vf vf_keep(vm m, vf a, vf fill) { return _mm512_mask_mov_ps(fill, m, a); }
AI vf vf_load_mask(const float *p, vm m) { return _mm512_maskz_loadu_ps(m, p); }
AI void vf_store_mask(float *p, vm m, vf a) { _mm512_mask_storeu_ps(p, m, a); }
AI vf vf_from_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
AI vf vf_from_bf16(const uint16_t *p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
AI vf vf_from_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* The low and the high nibbles of 16 bytes, as floats: each a lookup in a register of the 16
 * values (vpermps reads an index's low 4 bits, so the low nibble needs no mask), the same
 * floats as converting, in fewer instructions. */
AI void vf_from_nibbles(const uint8_t *p, vf *lo, vf *hi) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const vf codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    *lo = _mm512_permutexvar_ps(v, codes);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), codes);
}
AI vf vf_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
AI vf vf_scale2(vf p, vf n) { return _mm512_scalef_ps(p, n); }   /* p * 2^n, n integral */

/* Lane t of the result = sum of the 16 lanes of v[t] (a transpose-and-add tree). */
static inline vf vf_sum16(const vf *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) {
        const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
        b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

/* t[d * t_stride + i] = r[i] lane d: a 16x16 transpose in registers. */
static inline void vf_transpose16(const vf *r, float *t, int64_t t_stride) {
    __m512 a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            const __m512d x = _mm512_castps_pd(a[4 * i + j]), y = _mm512_castps_pd(a[4 * i + j + 2]);
            b[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            b[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    /* b[4i + k] holds, for rows 4i..4i+3, column k of each 128-bit lane: gather lanes. */
    for (int k = 0; k < 4; k++) {
        const __m512 c0 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0x88), c1 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0xDD);
        const __m512 c2 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0x88), c3 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0xDD);
        _mm512_storeu_ps(t + (k + 0) * t_stride, _mm512_shuffle_f32x4(c0, c2, 0x88));
        _mm512_storeu_ps(t + (k + 4) * t_stride, _mm512_shuffle_f32x4(c1, c3, 0x88));
        _mm512_storeu_ps(t + (k + 8) * t_stride, _mm512_shuffle_f32x4(c0, c2, 0xDD));
        _mm512_storeu_ps(t + (k + 12) * t_stride, _mm512_shuffle_f32x4(c1, c3, 0xDD));
    }
}

#else   /* FLEET_AVX2: two halves of 8 lanes */

typedef struct { __m256 lo, hi; } vf;
#define VF2(EXPR_LO, EXPR_HI) ((vf){EXPR_LO, EXPR_HI})
#define VF_IN_REG(x) __asm__("" : "+x"((x).lo), "+x"((x).hi))
AI vf vf_zero(void) { return VF2(_mm256_setzero_ps(), _mm256_setzero_ps()); }
AI vf vf_set1(float a) { return VF2(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
AI vf vf_load(const float *p) { return VF2(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
AI void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
AI vf vf_add(vf a, vf b) { return VF2(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
AI vf vf_sub(vf a, vf b) { return VF2(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
AI vf vf_mul(vf a, vf b) { return VF2(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
AI vf vf_div(vf a, vf b) { return VF2(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
AI vf vf_max(vf a, vf b) { return VF2(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
AI vf vf_fmadd(vf a, vf b, vf c) { return VF2(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)); }
AI vf vf_fnmadd(vf a, vf b, vf c) {
    return VF2(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
AI float vf_sum(vf a) {
    const __m256 s = _mm256_add_ps(a.lo, a.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
AI float vf_first(vf a) { return _mm256_cvtss_f32(a.lo); }   /* lane 0 */
AI float vf_hmax(vf a) {
    const __m256 s = _mm256_max_ps(a.lo, a.hi);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
}
typedef struct { __m256i lo, hi; } vm;
AI __m256i first8(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
AI vm vm_first(int n) { return (vm){first8(n), first8(n - 8)}; }
AI vf vf_keep(vm m, vf a, vf fill) {
    return VF2(_mm256_blendv_ps(fill.lo, a.lo, _mm256_castsi256_ps(m.lo)),
               _mm256_blendv_ps(fill.hi, a.hi, _mm256_castsi256_ps(m.hi)));
}
AI vf vf_load_mask(const float *p, vm m) { return VF2(_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)); }
AI void vf_store_mask(float *p, vm m, vf a) {
    _mm256_maskstore_ps(p, m.lo, a.lo);
    _mm256_maskstore_ps(p + 8, m.hi, a.hi);
}
/* The codes as two 8-byte loads, which vpmovsxbd / vpmovzxbd take from memory, rather than one
 * 16-byte load and a byte shift for its upper half: one shuffle fewer per 16 codes. int8 per
 * channel at one row, [49152 x 576], one thread, alternating builds on a 2-core AMD EPYC Zen 2
 * (family 23 model 49): 13.4-13.9 -> 15.0-15.1 G weights/s from L3, 8.3 -> 8.8-9.0 from memory. */
AI vf vf_from_i8(const int8_t *p) {
    const __m128i a = _mm_loadl_epi64((const __m128i *)p), b = _mm_loadl_epi64((const __m128i *)(p + 8));
    return VF2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
}
AI vf vf_from_bf16(const uint16_t *p) {
    const __m128i a = _mm_loadu_si128((const __m128i *)p), b = _mm_loadu_si128((const __m128i *)(p + 8));
    return VF2(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16)),
               _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)));
}
AI vf vf_from_f16(const uint16_t *p) {
    return VF2(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
}
AI void vf_from_nibbles(const uint8_t *p, vf *lo, vf *hi) {
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)),
                  b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    const __m256i low = _mm256_set1_epi32(15);
    *lo = VF2(_mm256_cvtepi32_ps(_mm256_and_si256(a, low)), _mm256_cvtepi32_ps(_mm256_and_si256(b, low)));
    *hi = VF2(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)));
}
AI vf vf_round(vf a) {
    return VF2(_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
               _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* p * 2^n for integral n in [-126, 128] (vf_exp's range; 128 gives inf): n into the exponent field. */
AI __m256 pow2_8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
AI vf vf_scale2(vf p, vf n) { return VF2(_mm256_mul_ps(p.lo, pow2_8(n.lo)), _mm256_mul_ps(p.hi, pow2_8(n.hi))); }

/* Lane t of the result = sum of the 8 lanes of s[t], t < 8. */
AI __m256 sum8x8(const __m256 *s) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
static inline vf vf_sum16(const vf *v) {
    __m256 s[16];
    for (int t = 0; t < 16; t++) s[t] = _mm256_add_ps(v[t].lo, v[t].hi);
    return VF2(sum8x8(s), sum8x8(s + 8));
}

/* t[d * t_stride + i] = r[i] lane d. */
static inline void vf_transpose16(const vf *r, float *t, int64_t t_stride) {
    float rows[16][16] __attribute__((aligned(32)));
    for (int i = 0; i < 16; i++) vf_store(rows[i], r[i]);
    for (int d = 0; d < 16; d++)
        for (int i = 0; i < 16; i++) t[d * t_stride + i] = rows[i][d];
}

#endif

/* exp(x): Cephes' range reduction and degree-6 polynomial (about 1 ulp); 0 below -87.3,
 * inf above 88.7. */
AI vf vf_exp(vf x) {
    x = vf_max(x, vf_set1(-87.3f));
#if defined(FLEET_AVX2)
    x = VF2(_mm256_min_ps(x.lo, _mm256_set1_ps(88.7f)), _mm256_min_ps(x.hi, _mm256_set1_ps(88.7f)));
#endif
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fmadd(p, vf_mul(r, r), vf_add(r, vf_set1(1.f)));
    return vf_scale2(p, n);
}

/* silu(g) * u as glue.c's fleet_silu_mul_f32 computes it (one formula: the fused gate/up
 * projection of linear.c gives the same bits). */
AI vf vf_silu_mul(vf g, vf u) {
    return vf_mul(vf_div(g, vf_add(vf_set1(1.f), vf_exp(vf_sub(vf_zero(), g)))), u);
}

#endif
#endif

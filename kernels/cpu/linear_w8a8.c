/* W8A8: y = x W^T (+ b) with x quantized per row on the fly and int8 per-channel weights,
 * as integer dot products (AVX512_VNNI vpdpbusd). It changes numerics (x is rounded to 8
 * bits), so it is a function of its own (linear_w8a8 in linear.py), never a silent path.
 *
 * x row r: xs[r] = max|x[r]| / 127, xq = round(x / xs[r]) in [-127, 127], stored as
 * xq + 128 (vpdpbusd multiplies unsigned by signed bytes). Weight: codes q [N, K] int8 in
 * tiles [ceil(N/32)][K/4][32][4] (four consecutive k of one channel in one 32-bit lane),
 * scale [N], and comp[n] = 128 * sum_k q[n][k], which takes the +128 back out:
 *   y[r][n] = xs[r] * scale[n] * (sum_k (xq + 128) q - comp[n]) (+ b[n]).
 * Sums are exact in int32 (|sum| < 2^31 for K < 33,000); the float conversion and the two
 * scalings round. From AMX_W8A8_ROWS rows on a CPU with AMX-INT8 the same sums come from the tile
 * unit (linear_amx.c): the same bits.
 *
 * Grouped activations (G < K, `w8a8-a<G>`): x row r gets one scale per group of G input
 * features, xs[r][g] = max|x[r][g*G .. (g+1)*G)| / 127, as llama.cpp's Q8 activations do, so
 * one loud channel coarsens the grid of its own group only. Each group's int32 sum, less its
 * share of the offset (comp[g][n] = 128 * sum over the group of q[n][k]), is converted and
 * added in float scaled by xs[r][g]; scale[n] multiplies the total:
 *   y[r][n] = scale[n] * sum_g xs[r][g] * (sum_{k in g} (xq + 128) q - comp[g][n]) (+ b[n]).
 * The float sum over groups runs in g order, so a row's result depends on that row alone. The
 * AMX path does not take grouped calls (its tiles sum 64 k at a time and would need a
 * store per group); they stay on VNNI there.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define W8A8_KERNEL 1
typedef uint8_t xcode_t;   /* x's codes as vpdpbusd takes them: xq + 128, unsigned */

/* quantize_rows for groups of G input features: xs [M][K / G]; G % 16 == 0, K % G == 0 (G == K:
 * one scale a row). */
static void quantize_groups(const float *x, int64_t M, int64_t K, int64_t G, xcode_t *xu, float *xs) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < K / G; g++) {
            const float *xr = x + r * K + g * G;
            __m512 amax = _mm512_setzero_ps();
            for (int64_t k = 0; k < G; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xr + k)));
            const float m = _mm512_reduce_max_ps(amax);
            const float scale = m > 0.f ? m / 127.f : 1.f;
            const __m512 s = _mm512_set1_ps(scale);
            for (int64_t k = 0; k < G; k += 16) {
                __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(xr + k), s));   /* nearest even */
                q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
                _mm_storeu_si128((__m128i *)(xu + r * K + g * G + k),
                                 _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128))));
            }
            xs[r * (K / G) + g] = scale;
        }
}


/* R rows of xu against one tile (codes w [K/4][32][4], scale and comp [32]). */
AI void w8a8_block(const int R, const xcode_t *xu, int64_t K, const float *xs, const int8_t *w, const float *scale,
                   const int32_t *comp, const float *bias, float *out, int64_t ldo, int cols, pf_t pf,
                   const int use_pf) {
    __m512i acc[RB][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    dot_span(R, xu, K, w, 0, K, acc, pf, use_pf);
    __m512 y[RB][2];
    for (int h = 0; h < 2; h++) {
        const __m512 s = _mm512_loadu_ps(scale + 16 * h);
        const __m512i c = _mm512_loadu_si512(comp + 16 * h);
        for (int r = 0; r < R; r++)
            y[r][h] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], c)),
                                    _mm512_mul_ps(s, _mm512_set1_ps(xs[r])));
    }
    store_rows(R, y, bias, out, ldo, cols);
}

/* The same with one activation scale per group of G: xs [R][K / G], comp [K / G][32]. */
AI void w8a8_group_block(const int R, const xcode_t *xu, int64_t K, int64_t G, const float *xs, const int8_t *w,
                         const float *scale, const int32_t *comp, const float *bias, float *out, int64_t ldo,
                         int cols, pf_t pf, const int use_pf) {
    const int64_t groups = K / G;
    __m512 y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[RB][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        dot_span(R, xu, K, w, g * G, g * G + G, acc, pf, use_pf);
        fold_group(R, acc, comp + g * TILE, xs + g, groups, y);
    }
    scale_rows(R, y, scale);
    store_rows(R, y, bias, out, ldo, cols);
}

#elif defined(FLEET_AVX2)
#define W8A8_KERNEL 1
typedef int8_t xcode_t;    /* x's codes, signed */
/* AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned by signed bytes into saturating int16
 * pairs. With the +128 offset a pair could reach 2 * 255 * 127 and saturate, so here x stays
 * signed and the sign moves onto the weight: |xq| * (q * sign(xq)), at most 2 * 127 * 127 per
 * pair, then vpmaddwd with ones into int32 lanes of four k. The int32 sums are exactly
 * sum_k xq q, as with VNNI (comp is not needed), so the results are the same bits. */

/* xq[r][k] = round(x[r][k] / xs[r][g]) in [-127, 127] for groups g of G input features:
 * xs [M][K / G]; G % 16 == 0, K % G == 0 (G == K: one scale a row). */
static void quantize_groups(const float *x, int64_t M, int64_t K, int64_t G, xcode_t *xq, float *xs) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < K / G; g++) {
            const float *xr = x + r * K + g * G;
            vf amax = vf_zero();
            for (int64_t k = 0; k < G; k += 16) amax = vf_max(amax, vf_max(vf_load(xr + k), vf_sub(vf_zero(), vf_load(xr + k))));
            const float m = vf_hmax(amax);
            const float scale = m > 0.f ? m / 127.f : 1.f;
            const vf s = vf_set1(scale);
            for (int64_t k = 0; k < G; k += 16) {
                const vf q = vf_div(vf_load(xr + k), s);
                const __m256i lim = _mm256_set1_epi32(127), neg = _mm256_set1_epi32(-127);
                const __m256i a = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(q.lo), neg), lim);   /* nearest even */
                const __m256i b = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(q.hi), neg), lim);
                const __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);   /* 16 int16 in order */
                _mm_storeu_si128((__m128i *)(xq + r * K + g * G + k),
                                 _mm_packs_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
            }
            xs[r * (K / G) + g] = scale;
        }
}

/* acc[r] += sum over k0 .. k1 of xq q for R rows of xq (row stride K) and tile w. */
AI void dot_span(const int R, const xcode_t *xq, int64_t K, const int8_t *w, int64_t k0, int64_t k1,
                 __m256i acc[RB][4], pf_t pf, const int use_pf) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t k = k0; k < k1; k += 4) {
        if (use_pf) pf_k(pf, k, 4);
        __m256i wv[4];
        for (int j = 0; j < 4; j++) wv[j] = _mm256_loadu_si256((const __m256i *)(w + k * TILE + 32 * j));
        for (int r = 0; r < R; r++) {
            const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xq + r * K + k));
            const __m256i ax = _mm256_sign_epi8(xb, xb);
            for (int j = 0; j < 4; j++) {
                const __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[j], xb));
                acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(p, ones));
            }
        }
    }
}

/* R rows of xq against one tile (codes w [K/4][32][4], scale [32]; comp is not needed). */
AI void w8a8_block(const int R, const xcode_t *xq, int64_t K, const float *xs, const int8_t *w, const float *scale,
                   const int32_t *comp, const float *bias, float *out, int64_t ldo, int cols, pf_t pf,
                   const int use_pf) {
    (void)comp;
    __m256i acc[RB][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_si256();
    dot_span(R, xq, K, w, 0, K, acc, pf, use_pf);
    vf y[RB][2];
    for (int h = 0; h < 2; h++) {
        const vf s = vf_load(scale + 16 * h);
        for (int r = 0; r < R; r++) {
            const vf sum = {_mm256_cvtepi32_ps(acc[r][2 * h]), _mm256_cvtepi32_ps(acc[r][2 * h + 1])};
            y[r][h] = vf_mul(sum, vf_mul(s, vf_set1(xs[r])));
        }
    }
    store_rows(R, y, bias, out, ldo, cols);
}

/* The same with one activation scale per group of G: xs [R][K / G]; comp is not needed. */
AI void w8a8_group_block(const int R, const xcode_t *xq, int64_t K, int64_t G, const float *xs, const int8_t *w,
                         const float *scale, const int32_t *comp, const float *bias, float *out, int64_t ldo,
                         int cols, pf_t pf, const int use_pf) {
    (void)comp;
    const int64_t groups = K / G;
    vf y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = vf_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m256i acc[RB][4];
        for (int r = 0; r < R; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_si256();
        dot_span(R, xq, K, w, g * G, g * G + G, acc, pf, use_pf);
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++) {
                const vf sum = {_mm256_cvtepi32_ps(acc[r][2 * h]), _mm256_cvtepi32_ps(acc[r][2 * h + 1])};
                y[r][h] = vf_fmadd(sum, vf_set1(xs[r * groups + g]), y[r][h]);
            }
    }
    for (int h = 0; h < 2; h++) {
        const vf s = vf_load(scale + 16 * h);
        for (int r = 0; r < R; r++) y[r][h] = vf_mul(y[r][h], s);
    }
    store_rows(R, y, bias, out, ldo, cols);
}

#endif

#if defined(W8A8_KERNEL)
typedef void (*w8a8_fn)(const xcode_t *, int64_t, int64_t, const float *, const int8_t *, const float *,
                        const int32_t *, const float *, float *, int64_t, int, pf_t);
#define W8A8(R)                                                                                          \
    static void w8a8_##R(const xcode_t *xu, int64_t K, int64_t G, const float *xs, const int8_t *w,       \
                         const float *s, const int32_t *c, const float *b, float *out, int64_t ldo, int cols, \
                         pf_t pf) {                                                                       \
        if (G < K && pf.p) w8a8_group_block(R, xu, K, G, xs, w, s, c, b, out, ldo, cols, pf, 1);         \
        else if (G < K) w8a8_group_block(R, xu, K, G, xs, w, s, c, b, out, ldo, cols, pf, 0);            \
        else if (pf.p) w8a8_block(R, xu, K, xs, w, s, c, b, out, ldo, cols, pf, 1);                      \
        else w8a8_block(R, xu, K, xs, w, s, c, b, out, ldo, cols, pf, 0);                                \
    }
W8A8(1) W8A8(2) W8A8(3)
#if RB == 8
W8A8(4) W8A8(5) W8A8(6) W8A8(7) W8A8(8)
static const w8a8_fn w8a8_blocks[RB + 1] = {NULL, w8a8_1, w8a8_2, w8a8_3, w8a8_4, w8a8_5, w8a8_6, w8a8_7, w8a8_8};
#else
static const w8a8_fn w8a8_blocks[RB + 1] = {NULL, w8a8_1, w8a8_2, w8a8_3};
#endif

int fleet_linear_w8a8_supported(void) { return 1; }

/* G: input features per activation scale (K: one a row); comps [NT][K / G][TILE]. */
int fleet_linear_w8a8(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const int8_t *codes,
                      const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads) {
    if (K < 16 || K % 16 || G < 16 || G % 16 || K % G || N < 1 || M < 0) return 1;
    const int64_t groups = K / G;
    const int64_t padded = (M + 31) / 32 * 32;   /* the AMX path reads x's codes in blocks of 32 rows */
    xcode_t *xu = malloc((size_t)(padded * K + 64));
    float *xs = malloc((size_t)(M * groups + 1) * sizeof(float));
    if (!xu || !xs) {
        free(xu);
        free(xs);
        return 3;
    }
    quantize_groups(x, M, K, G, xu, xs);
#if defined(__AVX512VNNI__)
    if (M >= AMX_W8A8_ROWS && groups == 1) {
        memset(xu + M * K, 128, (size_t)((padded - M) * K));   /* zero codes in the padding */
        if (!fleet_w8a8_amx(xu, xs, M, N, K, codes, scales, comps, bias, out, num_threads)) {
            free(xu);
            free(xs);
            return 0;
        }
    }
#endif
    const int64_t tiles = (N + TILE - 1) / TILE;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (tiles > 1 && M * N * K >= 65536)
    for (int64_t i = 0; i < tiles; i++) {
        const int cols = tile_cols(N, i);
        for (int64_t r0 = 0; r0 < M; r0 += RB) {
            const int R = M - r0 < RB ? (int)(M - r0) : RB;
            w8a8_blocks[R](xu + r0 * K, K, G, xs + r0 * groups, codes + i * K * TILE, scales + i * TILE,
                           comps + i * groups * TILE, bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N,
                           cols, pf_plan((const char *)(codes + i * K * TILE), K * TILE, K, M, r0 / RB));
        }
    }
    free(xu);
    free(xs);
    return 0;
}

#else   /* neither AVX512_VNNI nor AVX2: linear_w8a8 computes its reference in torch */

int fleet_linear_w8a8_supported(void) { return 0; }

int fleet_linear_w8a8(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const int8_t *codes,
                      const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads) {
    (void)x; (void)M; (void)N; (void)K; (void)G; (void)codes; (void)scales; (void)comps; (void)bias; (void)out;
    (void)num_threads;
    return 1;
}
#endif

/* Weight-only int8 (per output channel) and int4 (groups of 32 or more) calls of many rows on
 * CPUs with AVX512_VNNI and no AMX: x carried as two bytes a value, the products as integer
 * dot products (vpdpbusd).
 *
 * Past a few rows such a call is bound by the multiply-adds, not by the weights' stream: its
 * codes decoded to float32 run as many FMAs as fp32 does, plus the decode, so it cannot be
 * faster than fp32 there (a 2-core AMD EPYC Zen 4: int8 1.05-1.16x fp32's time at 32-64 rows).
 * vpdpbusd does 64 byte products a zmm instruction, an FMA 16; with x in two bytes a product
 * takes two, so 32 products an instruction, twice an FMA's.
 *
 * x row r, group g of XG (64) input features (32 for int4 in groups of 32, so that each x group
 * lies inside one weight group): xs[r][g] = max|x| / 32767 over the group,
 * X = round(x / xs) in [-32767, 32767] (nearest even), stored as U = X + 32768 = 256 hi + lo,
 * two unsigned bytes. A row group whose values are not all finite gets xs = NaN (the row's
 * outputs become NaN, as a float matmul gives). For channel n with codes q:
 *   S_g = 256 sum_k hi q + sum_k lo q - 32768 sum_k q   (= sum_{k in g} X q, exact in int32:
 *   |256 sum hi q| <= 256 * 255 * 127 * 64 < 2^31)
 *   int8: y[r][n] = scale[n] * (sum over g, in g order, of S_g * xs[r][g] as fused multiply-adds) (+ b[n])
 *   int4 (w = q * scale + min a weight group, x group g inside weight group G(g)): over g in
 *   order, y += S_g * (xs * scale[G(g)][n]), then y += min[G(g)][n] * (xs * sum_{k in g} X).
 * So x is rounded to 16 bits relative to its group's largest value, about what the AMX path's
 * two bf16 (hi + lo) keep of each value, and far below the weights' own rounding; the sums of
 * products are exact. A row's result depends on that row alone; calls of fewer than DIGIT_ROWS
 * rows keep linear.c's float path (so, as on AMX CPUs, a row's bits differ between a small and
 * a large call).
 *
 * Each thread lays its tile's codes out as vpdpbusd takes them ([K/4][32][4]: four
 * consecutive k of a channel in one 32-bit lane, 18 KiB at K = 576, in L1) with each group's
 * code sums, then runs the rows in blocks of at most DB over it. */
#include <stdint.h>
#include <stdlib.h>

#include "linear.h"

#define XG 64           /* x's group: one scale per 64 input features */
#define DIGIT_ROWS 9    /* calls from this many rows on take this path (fleet_digit_tuning): RB + 1 */

/* x's group for a call (0: the path does not take it): XG for per-channel int8 and int4 in
 * groups of a multiple of XG, XG / 2 for int4 in other groups of a multiple of 32 (so each x
 * group lies inside one weight group; int4's groups are powers of two, so that is 32); K a multiple of it. */
static int64_t x_group(int fmt, int64_t K, int64_t G) {
    const int64_t xg = fmt == FMT_INT8 && G == K ? XG : fmt == FMT_INT4 && G % XG == 0 ? XG
                     : fmt == FMT_INT4 && G % (XG / 2) == 0 ? XG / 2 : 0;
    return xg && K >= xg && K % xg == 0 ? xg : 0;
}

/* The calls this path takes (where it runs): per-channel int8 (K a multiple of 64), and int4
 * in groups of a multiple of 32; returns x's group for them (x_group), 0 for the others. */
int fleet_digits_take(int fmt, int64_t K, int64_t G) {
    return (int)x_group(fmt, K, G);
}

#if defined(FLEET_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
#include <math.h>
#include <omp.h>
#include "tile_decode.h"
#define DB 6            /* rows a block: 24 accumulators (12 int32 of a group, 12 float totals) */

/* Row r of x [M][K] as the two digit planes hi, lo [M][K], scales xs [M][K / xg] and xsum =
 * xs * sum X over each group of xg (XG or XG / 2) features (what int4's mins multiply). */
static void x_digits(const float *x, int64_t r, int64_t K, int64_t xg, uint8_t *hi, uint8_t *lo, float *xs,
                     float *xsum) {
    const __m512i lim = _mm512_set1_epi32(32767), neg = _mm512_set1_epi32(-32767);
    const __m512i off = _mm512_set1_epi32(32768), low = _mm512_set1_epi32(255);
    for (int64_t g = 0; g < K / xg; g++) {
        const float *xr = x + r * K + g * xg;
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int k = 0; k < xg; k += 16) {
            const __m512 v = _mm512_loadu_ps(xr + k);
            bad |= _mm512_fpclass_ps_mask(v, 0x01 | 0x08 | 0x10 | 0x80);   /* NaN, +-inf */
            amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
        }
        const float m = _mm512_reduce_max_ps(amax);
        const float scale = bad ? NAN : m > 0.f ? m / 32767.f : 1.f;
        const __m512 s = _mm512_set1_ps(bad ? 1.f : scale);
        int64_t sum = 0;
        for (int k = 0; k < xg; k += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(xr + k), s));   /* nearest even */
            q = _mm512_min_epi32(_mm512_max_epi32(q, neg), lim);
            sum += _mm512_reduce_add_epi32(q);
            q = _mm512_add_epi32(q, off);
            _mm_storeu_si128((__m128i *)(hi + r * K + g * xg + k), _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 8)));
            _mm_storeu_si128((__m128i *)(lo + r * K + g * xg + k), _mm512_cvtepi32_epi8(_mm512_and_si512(q, low)));
        }
        xs[r * (K / xg) + g] = scale;
        xsum[r * (K / xg) + g] = scale * (float)sum;   /* |sum| <= 64 * 32767: exact in float */
    }
}

/* Four k of 32 channels (a0..a3: one k each, a byte a channel) as vpdpbusd's [32][4] at o. */
AI void quad_store(__m256i a0, __m256i a1, __m256i a2, __m256i a3, int8_t *o) {
    /* per 128-bit lane: bytes of k, k+1 interleaved, then of k+2, k+3; then 16-bit pairs */
    const __m256i t0 = _mm256_unpacklo_epi8(a0, a1), t1 = _mm256_unpackhi_epi8(a0, a1);
    const __m256i t2 = _mm256_unpacklo_epi8(a2, a3), t3 = _mm256_unpackhi_epi8(a2, a3);
    const __m256i u0 = _mm256_unpacklo_epi16(t0, t2);   /* channels 0-3 | 16-19 */
    const __m256i u1 = _mm256_unpackhi_epi16(t0, t2);   /* 4-7 | 20-23 */
    const __m256i u2 = _mm256_unpacklo_epi16(t1, t3);   /* 8-11 | 24-27 */
    const __m256i u3 = _mm256_unpackhi_epi16(t1, t3);   /* 12-15 | 28-31 */
    _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 64), _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256((__m256i *)(o + 96), _mm256_permute2x128_si256(u2, u3, 0x31));
}

/* A packed tile (int8 [K][32], or int4 [K/2][32]: k = 2j in the low nibble of row j, 2j + 1
 * in the high) as vpdpbusd's [K/4][32][4] codes in w, and comp [K / xg][32]: 32768 x each x
 * group's sum of a channel's codes (what the +32768 of U adds). */
static void tile_layout(int fmt, const uint8_t *t, int64_t K, int64_t xg, int8_t *w, int32_t *comp) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int64_t k = 0; k < K; k += 4) {
        if (fmt == FMT_INT8) {
            quad_store(_mm256_loadu_si256((const __m256i *)(t + k * TILE)),
                       _mm256_loadu_si256((const __m256i *)(t + (k + 1) * TILE)),
                       _mm256_loadu_si256((const __m256i *)(t + (k + 2) * TILE)),
                       _mm256_loadu_si256((const __m256i *)(t + (k + 3) * TILE)), w + k * TILE);
        } else {
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)(t + k / 2 * TILE));
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(t + (k / 2 + 1) * TILE));
            quad_store(_mm256_and_si256(b0, nib), _mm256_and_si256(_mm256_srli_epi16(b0, 4), nib),
                       _mm256_and_si256(b1, nib), _mm256_and_si256(_mm256_srli_epi16(b1, 4), nib), w + k * TILE);
        }
    }
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < K / xg; g++) {
        __m512i c0 = _mm512_setzero_si512(), c1 = c0;
        for (int64_t k = g * xg; k < g * xg + xg; k += 4) {
            c0 = _mm512_dpbusd_epi32(c0, ones, _mm512_loadu_si512(w + k * TILE));
            c1 = _mm512_dpbusd_epi32(c1, ones, _mm512_loadu_si512(w + k * TILE + 64));
        }
        _mm512_storeu_si512(comp + g * TILE, _mm512_slli_epi32(c0, 15));
        _mm512_storeu_si512(comp + g * TILE + 16, _mm512_slli_epi32(c1, 15));
    }
}

typedef struct {            /* one block of rows against one laid-out tile */
    const uint8_t *hi, *lo;     /* the block's digit planes (row stride K) */
    const float *xs, *xsum;     /* [rows][K / xg] */
    int64_t K, G, xg;           /* G: the weight's group (int4), K for per-channel int8; xg: x's */
    const int8_t *w;            /* tile_layout's codes */
    const int32_t *comp;
    const void *scales, *mins;  /* the tile's: [1][32] float32 (int8), [K / G][32] fp16 (int4) */
} dblock_t;

/* int4's group g of x (in weight group g * xg / G): y += (acc - comp) * xs * scale + xsum * min. */
AI void fold_int4(const int R, __m512i (*acc)[2], const dblock_t *d, int64_t g, vf y[RB][2]) {
    const int64_t groups = d->K / d->xg, wg = g * d->xg / d->G;
    for (int h = 0; h < 2; h++) {
        const __m512i c = _mm512_loadu_si512(d->comp + g * TILE + 16 * h);
        const vf s = vf_from_f16((const uint16_t *)d->scales + wg * TILE + 16 * h),
                 m = vf_from_f16((const uint16_t *)d->mins + wg * TILE + 16 * h);
        for (int r = 0; r < R; r++) {
            const vf sx = vf_mul(s, vf_set1(d->xs[r * groups + g]));
            y[r][h] = vf_fmadd(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], c)), sx, y[r][h]);
            y[r][h] = vf_fmadd(m, vf_set1(d->xsum[r * groups + g]), y[r][h]);
        }
    }
}

/* R rows against one laid-out tile, fmt FMT_INT8 or FMT_INT4. */
AI void digit_rows(const int R, const int fmt, const dblock_t *d, const float *bias, float *out, int64_t ldo, int cols) {
    const int64_t K = d->K, xg = d->xg, groups = K / xg;
    vf y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = vf_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[RB][2];   /* R <= DB of them */
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        dot_span(R, d->hi, K, d->w, g * xg, g * xg + xg, acc, (pf_t){NULL, 0, 0}, 0);
        for (int r = 0; r < R; r++) acc[r][0] = _mm512_slli_epi32(acc[r][0], 8), acc[r][1] = _mm512_slli_epi32(acc[r][1], 8);
        dot_span(R, d->lo, K, d->w, g * xg, g * xg + xg, acc, (pf_t){NULL, 0, 0}, 0);
        if (fmt == FMT_INT8) fold_group(R, acc, d->comp + g * TILE, d->xs + g, groups, y);
        else fold_int4(R, acc, d, g, y);
    }
    if (fmt == FMT_INT8) scale_rows(R, y, d->scales);
    store_rows(R, y, bias, out, ldo, cols);
}

typedef void (*digit_fn)(const dblock_t *, const float *, float *, int64_t, int);
#define DIGITS(R)                                                                                            \
    static void int8_##R(const dblock_t *d, const float *bias, float *out, int64_t ldo, int cols) {          \
        digit_rows(R, FMT_INT8, d, bias, out, ldo, cols);                                                    \
    }                                                                                                        \
    static void int4_##R(const dblock_t *d, const float *bias, float *out, int64_t ldo, int cols) {          \
        digit_rows(R, FMT_INT4, d, bias, out, ldo, cols);                                                    \
    }
DIGITS(1) DIGITS(2) DIGITS(3) DIGITS(4) DIGITS(5) DIGITS(6)
static const digit_fn int8_blocks[DB + 1] = {NULL, int8_1, int8_2, int8_3, int8_4, int8_5, int8_6};
static const digit_fn int4_blocks[DB + 1] = {NULL, int4_1, int4_2, int4_3, int4_4, int4_5, int4_6};

int fleet_linear_digits(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                        const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    const int64_t xg = x_group(fmt, K, G);
    if (!xg || M < 1 || N < 1 || fleet_amx_ready()) return 1;
    const int64_t tiles = (N + TILE - 1) / TILE, groups = K / xg;
    uint8_t *planes = malloc((size_t)(2 * M * K));
    float *xs = malloc((size_t)(2 * M * groups) * sizeof(float));
    int failed = !planes || !xs;
    if (!failed) {
        uint8_t *hi = planes, *lo = planes + M * K;
        float *xsum = xs + M * groups;
        #pragma omp parallel num_threads(num_threads)
        {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) x_digits(x, r, K, xg, hi, lo, xs, xsum);
            int8_t *w = aligned_alloc(64, (size_t)(K * TILE));
            int32_t *comp = aligned_alloc(64, (size_t)(groups * TILE) * sizeof(int32_t));
            if (!w || !comp) failed = 1;
            #pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < tiles; i++) {
                if (!w || !comp) continue;
                const tile_t t = tile_at(fmt, data, scales, mins, K, G, i);   /* its codes, scales and mins */
                tile_layout(fmt, t.data, K, xg, w, comp);
                const int cols = tile_cols(N, i);
                const int64_t blocks = (M + DB - 1) / DB;
                for (int64_t b = 0, r0 = 0; b < blocks; b++) {
                    const int R = pass_rows(M, r0, blocks, b);
                    const dblock_t d = {hi + r0 * K, lo + r0 * K, xs + r0 * groups, xsum + r0 * groups, K, G, xg, w, comp,
                                        t.scales, t.mins};
                    (fmt == FMT_INT8 ? int8_blocks : int4_blocks)[R](&d, bias ? bias + i * TILE : NULL,
                                                                      out + r0 * N + i * TILE, N, cols);
                    r0 += R;
                }
            }
            free(w);
            free(comp);
        }
    }
    free(planes);
    free(xs);
    return failed ? 3 : 0;
}

static int from_rows = DIGIT_ROWS;

/* The rows from which fleet_digits_take's calls take this path (0: never; so on CPUs with AMX,
 * whose split path serves them); rows >= 0 sets it (1: every call, for the tests; 0 turns it
 * off), -1 leaves it. */
int fleet_digit_tuning(int rows) {
    if (rows >= 0) from_rows = rows;
    return fleet_amx_ready() ? 0 : from_rows;
}

#else   /* no AVX512_VNNI here: int8 and int4 keep linear.c's float path */
int fleet_linear_digits(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                        const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)fmt, (void)x, (void)M, (void)N, (void)K, (void)G, (void)data, (void)scales, (void)mins, (void)bias;
    (void)out, (void)num_threads;
    return 1;
}

int fleet_digit_tuning(int rows) {
    (void)rows;
    return 0;
}
#endif

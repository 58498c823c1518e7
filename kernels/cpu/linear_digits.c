/* Weight-only int8 (per output channel) calls of many rows on CPUs with AVX512_VNNI and no
 * AMX: x carried as two bytes a value, the products as integer dot products (vpdpbusd).
 *
 * Past a few rows an int8 call is bound by the multiply-adds, not by the weights' stream: its
 * codes decoded to float32 run as many FMAs as fp32 does, plus the decode, so it cannot be
 * faster than fp32 there (a 2-core AMD EPYC Zen 4: 1.05-1.16x fp32's time at 32-64 rows).
 * vpdpbusd does 64 byte products a zmm instruction, an FMA 16. Two digits of x give two of
 * them for what one FMA per 16 products took.
 *
 * x row r, group g of XG (64) input features: xs[r][g] = max|x| / 32767 over the group,
 * X = round(x / xs) in [-32767, 32767] (nearest even), stored as U = X + 32768 = 256 hi + lo,
 * two unsigned bytes. A row group whose values are not all finite gets xs = NaN (the row's
 * outputs become NaN, as a float matmul gives). For channel n with codes q and scale[n]:
 *   S_g = 256 sum_k hi q + sum_k lo q - 32768 sum_k q   (= sum_{k in g} X q, exact in int32:
 *   |256 sum hi q| <= 256 * 255 * 127 * 64 < 2^31)
 *   y[r][n] = scale[n] * (sum over g, in g order, of S_g * xs[r][g] as fused multiply-adds) (+ b[n]).
 * So x is rounded to 16 bits relative to its group's largest value, about what the AMX path's
 * two bf16 (hi + lo) keep of each value, and far below int8's own rounding of the weights;
 * the sums of products are exact. A row's result depends on that row alone; calls of fewer
 * than DIGIT_ROWS rows keep linear.c's float path (so, as on AMX CPUs, a row's bits differ
 * between a small and a large call).
 *
 * Each thread lays its tile's codes out as vpdpbusd takes them ([K/4][32][4]: four
 * consecutive k of a channel in one 32-bit lane, 18 KiB at K = 576, in L1) with each group's
 * code sums, then runs the rows in blocks of at most DB over it. */
#include <stdint.h>
#include <stdlib.h>

#include "linear.h"

#define XG 64           /* x's group: one scale per 64 input features */
#define DIGIT_ROWS 9    /* int8 calls from this many rows on take this path (fleet_digit_tuning): RB + 1 */

#if defined(FLEET_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
#include <math.h>
#include <omp.h>
#define DIGITS_KERNEL 1
#define DB 6            /* rows a block: 24 accumulators (12 int32 of a group, 12 float totals) */

/* Row r of x [M][K] as the two digit planes hi, lo [M][K] and scales xs [M][K / XG]. */
static void x_digits(const float *x, int64_t r, int64_t K, uint8_t *hi, uint8_t *lo, float *xs) {
    const __m512i lim = _mm512_set1_epi32(32767), neg = _mm512_set1_epi32(-32767);
    const __m512i off = _mm512_set1_epi32(32768), low = _mm512_set1_epi32(255);
    for (int64_t g = 0; g < K / XG; g++) {
        const float *xr = x + r * K + g * XG;
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int k = 0; k < XG; k += 16) {
            const __m512 v = _mm512_loadu_ps(xr + k);
            bad |= _mm512_fpclass_ps_mask(v, 0x01 | 0x08 | 0x10 | 0x80);   /* NaN, +-inf */
            amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
        }
        const float m = _mm512_reduce_max_ps(amax);
        const float scale = bad ? NAN : m > 0.f ? m / 32767.f : 1.f;
        const __m512 s = _mm512_set1_ps(bad ? 1.f : scale);
        for (int k = 0; k < XG; k += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(xr + k), s));   /* nearest even */
            q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, neg), lim), off);
            _mm_storeu_si128((__m128i *)(hi + r * K + g * XG + k), _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 8)));
            _mm_storeu_si128((__m128i *)(lo + r * K + g * XG + k), _mm512_cvtepi32_epi8(_mm512_and_si512(q, low)));
        }
        xs[r * (K / XG) + g] = scale;
    }
}

/* A packed int8 tile [K][32] as vpdpbusd's [K/4][32][4] in w, and comp [K / XG][32]: 32768 x
 * each group's sum of a channel's codes (what the +32768 of U adds). */
static void tile_layout(const int8_t *t, int64_t K, int8_t *w, int32_t *comp) {
    for (int64_t k = 0; k < K; k += 4) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(t + k * TILE));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(t + (k + 1) * TILE));
        const __m256i a2 = _mm256_loadu_si256((const __m256i *)(t + (k + 2) * TILE));
        const __m256i a3 = _mm256_loadu_si256((const __m256i *)(t + (k + 3) * TILE));
        /* per 128-bit lane: bytes of k, k+1 interleaved, then of k+2, k+3; then 16-bit pairs */
        const __m256i t0 = _mm256_unpacklo_epi8(a0, a1), t1 = _mm256_unpackhi_epi8(a0, a1);
        const __m256i t2 = _mm256_unpacklo_epi8(a2, a3), t3 = _mm256_unpackhi_epi8(a2, a3);
        const __m256i u0 = _mm256_unpacklo_epi16(t0, t2);   /* channels 0-3 | 16-19 */
        const __m256i u1 = _mm256_unpackhi_epi16(t0, t2);   /* 4-7 | 20-23 */
        const __m256i u2 = _mm256_unpacklo_epi16(t1, t3);   /* 8-11 | 24-27 */
        const __m256i u3 = _mm256_unpackhi_epi16(t1, t3);   /* 12-15 | 28-31 */
        int8_t *o = w + k * TILE;
        _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(u0, u1, 0x20));
        _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(u2, u3, 0x20));
        _mm256_storeu_si256((__m256i *)(o + 64), _mm256_permute2x128_si256(u0, u1, 0x31));
        _mm256_storeu_si256((__m256i *)(o + 96), _mm256_permute2x128_si256(u2, u3, 0x31));
    }
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < K / XG; g++) {
        __m512i c0 = _mm512_setzero_si512(), c1 = c0;
        for (int64_t k = g * XG; k < g * XG + XG; k += 4) {
            c0 = _mm512_dpbusd_epi32(c0, ones, _mm512_loadu_si512(w + k * TILE));
            c1 = _mm512_dpbusd_epi32(c1, ones, _mm512_loadu_si512(w + k * TILE + 64));
        }
        _mm512_storeu_si512(comp + g * TILE, _mm512_slli_epi32(c0, 15));
        _mm512_storeu_si512(comp + g * TILE + 16, _mm512_slli_epi32(c1, 15));
    }
}

/* acc[r] += the dot products of one digit plane d (R rows, stride K) with w over one group. */
AI void digit_group(const int R, const uint8_t *d, int64_t K, const int8_t *w, int64_t k0, __m512i acc[DB][2]) {
    for (int64_t k = k0; k < k0 + XG; k += 4) {
        const __m512i w0 = _mm512_loadu_si512(w + k * TILE), w1 = _mm512_loadu_si512(w + k * TILE + 64);
        for (int r = 0; r < R; r++) {
            const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(d + r * K + k));
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], xb, w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], xb, w1);
        }
    }
}

/* R rows (digit planes at hi, lo, scales xs [R][K / XG]) against one laid-out tile. */
AI void digit_rows(const int R, const uint8_t *hi, const uint8_t *lo, const float *xs, int64_t K, const int8_t *w,
                   const int32_t *comp, const float *scale, const float *bias, float *out, int64_t ldo, int cols) {
    const int64_t groups = K / XG;
    vf y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = vf_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[DB][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        digit_group(R, hi, K, w, g * XG, acc);
        for (int r = 0; r < R; r++) acc[r][0] = _mm512_slli_epi32(acc[r][0], 8), acc[r][1] = _mm512_slli_epi32(acc[r][1], 8);
        digit_group(R, lo, K, w, g * XG, acc);
        fold_group(R, acc, comp + g * TILE, xs + g, groups, y);
    }
    scale_rows(R, y, scale);
    store_rows(R, y, bias, out, ldo, cols);
}

typedef void (*digit_fn)(const uint8_t *, const uint8_t *, const float *, int64_t, const int8_t *, const int32_t *,
                         const float *, const float *, float *, int64_t, int);
#define DIGITS(R)                                                                                                \
    static void digits_##R(const uint8_t *hi, const uint8_t *lo, const float *xs, int64_t K, const int8_t *w,  \
                           const int32_t *comp, const float *scale, const float *bias, float *out, int64_t ldo, \
                           int cols) {                                                                          \
        digit_rows(R, hi, lo, xs, K, w, comp, scale, bias, out, ldo, cols);                                     \
    }
DIGITS(1) DIGITS(2) DIGITS(3) DIGITS(4) DIGITS(5) DIGITS(6)
static const digit_fn digit_blocks[DB + 1] = {NULL, digits_1, digits_2, digits_3, digits_4, digits_5, digits_6};

int fleet_linear_digits(const float *x, int64_t M, int64_t N, int64_t K, const int8_t *codes, const float *scales,
                        const float *bias, float *out, int num_threads) {
    if (M < 1 || N < 1 || K < XG || K % XG || fleet_amx_ready()) return 1;
    const int64_t tiles = (N + TILE - 1) / TILE, groups = K / XG;
    uint8_t *planes = malloc((size_t)(2 * M * K));
    float *xs = malloc((size_t)(M * groups) * sizeof(float));
    int failed = !planes || !xs;
    if (!failed) {
        uint8_t *hi = planes, *lo = planes + M * K;
        #pragma omp parallel num_threads(num_threads)
        {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) x_digits(x, r, K, hi, lo, xs);
            int8_t *w = aligned_alloc(64, (size_t)(K * TILE));
            int32_t *comp = aligned_alloc(64, (size_t)(groups * TILE) * sizeof(int32_t));
            if (!w || !comp) failed = 1;
            #pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < tiles; i++) {
                if (!w || !comp) continue;
                tile_layout(codes + i * K * TILE, K, w, comp);
                const int cols = tile_cols(N, i);
                const int64_t blocks = (M + DB - 1) / DB;
                for (int64_t b = 0, r0 = 0; b < blocks; b++) {
                    const int R = pass_rows(M, r0, blocks, b);
                    digit_blocks[R](hi + r0 * K, lo + r0 * K, xs + r0 * groups, K, w, comp, scales + i * TILE,
                                    bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N, cols);
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

/* The rows from which int8 calls take this path (0: never; so on CPUs with AMX, whose split
 * path serves them); rows > 0 sets it (1: every call, for the tests; 0 turns it off), -1 leaves it. */
int fleet_digit_tuning(int rows) {
    if (rows >= 0) from_rows = rows;
    return fleet_amx_ready() ? 0 : from_rows;
}

#else   /* no AVX512_VNNI here: int8 keeps linear.c's float path */
int fleet_linear_digits(const float *x, int64_t M, int64_t N, int64_t K, const int8_t *codes, const float *scales,
                        const float *bias, float *out, int num_threads) {
    (void)x, (void)M, (void)N, (void)K, (void)codes, (void)scales, (void)bias, (void)out, (void)num_threads;
    return 1;
}

int fleet_digit_tuning(int rows) {
    (void)rows;
    return 0;
}
#endif

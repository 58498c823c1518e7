/* The greedy token of an fp32 LM head from a bf16 screen (greedy_head.py): a cheap pass that
 * rules out every token that cannot be the largest logit, leaving a few candidates that the
 * exact fp32 matmul then decides between.
 *
 * fleet_bf16dot: approx[M][N] = bf16(x) . bf16(w), AVX512_BF16 dot products (vdpbf16ps: two
 * bf16 products a lane and the accumulator, float32) over w packed as [ceil(N/32)][K/2][32][2]
 * bf16: a pair of consecutive k of one channel in each 32-bit lane, 32 channels a tile. x is
 * rounded to bf16 (to nearest even) here. Half the bytes of the fp32 head and two
 * multiply-adds a lane per instruction, so the pass takes about half the fp32 matmul's time
 * at any row count. On AVX-512 CPUs without AVX512_BF16 the same packed bytes are widened to
 * float32 in registers and multiplied there (exact products of two bf16 values): half the
 * bytes, the fp32 matmul's multiply-adds, so it pays only where the head is memory-bound.
 *
 * fleet_head_candidates: given approx, |x| (each row's 2-norm), |w_j| (each channel's) and c,
 * row m's candidates are the j with approx[m][j] + c |x_m| |w_j| >= approx[m][k] - c |x_m| |w_k|,
 * k the row's largest approx. greedy_head.py chooses c so that c |x| |w_j| bounds the
 * difference between approx and any float32 evaluation of x . w_j (the bf16 rounding of both
 * operands and the float32 sums; Cauchy-Schwarz gives sum |x_i w_ji| <= |x| |w_j|): every j
 * left out is then strictly below the row's fp32 maximum. Compared in double, so the
 * comparison adds no rounding of its own.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "linear.h"

#if defined(FLEET_AVX512)
#define SCREEN 1    /* the screen runs: natively with AVX512_BF16, else widened to float32 */
#if defined(__AVX512BF16__)
#define BF16DOT 1
#define HB_ROWS 8   /* rows per register block: 8 x 2 accumulators */
#else
#define HB_ROWS 6   /* 6 x 4 accumulators */
#ifndef SCREEN_AHEAD
#define SCREEN_AHEAD 32768
#endif
#endif

/* float -> bf16 bits, round to nearest even (torch's .bfloat16() for finite values). */
static inline uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#endif

#if defined(BF16DOT)

/* R rows of xp (pairs [R][K/2]) against one tile wt [K/2][32][2]: 32 channels into out. */
static inline __attribute__((always_inline)) void tile_rows(const int R, const uint32_t *xp, int64_t KP,
                                                          const uint16_t *wt, float *out, int64_t ldo, int cols) {
    __m512 acc[HB_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < KP; kp++) {
        __m512i w0 = _mm512_loadu_si512(wt + kp * 64), w1 = _mm512_loadu_si512(wt + kp * 64 + 32);
        __asm__("" : "+v"(w0), "+v"(w1));   /* one load each, not one per row (simd.h's VF_IN_REG) */
        for (int r = 0; r < R; r++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[r * KP + kp]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, (__m512bh)w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, (__m512bh)w1);
        }
    }
    const vm m0 = vm_first(cols), m1 = vm_first(cols - 16);
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(out + r * ldo, m0, acc[r][0]);
        _mm512_mask_storeu_ps(out + r * ldo + 16, m1, acc[r][1]);
    }
}

typedef void (*rows_fn)(const uint32_t *, int64_t, const uint16_t *, float *, int64_t, int);
#define ROWS(R) \
    static void rows_##R(const uint32_t *xp, int64_t KP, const uint16_t *wt, float *out, int64_t ldo, int cols) { \
        tile_rows(R, xp, KP, wt, out, ldo, cols); \
    }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
static const rows_fn row_blocks[HB_ROWS + 1] = {NULL, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7,
                                                rows_8};
#elif defined(SCREEN)
/* AVX-512 without AVX512_BF16: the same packed pairs, each lane's two bf16 widened to float32
 * (the even k by a shift, the odd by a mask: exact) and multiplied into x's bf16 values, held
 * as float32 (xr [R][K]; exact products), with the even and the odd k in accumulators of
 * their own. Twice the multiply-adds of vdpbf16ps, the same bytes: it pays where the head is
 * memory-bound, few rows (greedy_head.py's max_rows). */
static inline __attribute__((always_inline)) void tile_rows(const int R, const float *xr, int64_t KP,
                                                          const uint16_t *wt, float *out, int64_t ldo, int cols) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[HB_ROWS][4];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < KP; kp++) {
        _mm_prefetch((const char *)(wt + kp * 64) + SCREEN_AHEAD, _MM_HINT_T1);
        _mm_prefetch((const char *)(wt + kp * 64) + SCREEN_AHEAD + 64, _MM_HINT_T1);
        const __m512i w0 = _mm512_loadu_si512(wt + kp * 64), w1 = _mm512_loadu_si512(wt + kp * 64 + 32);
        const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
        const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
        for (int r = 0; r < R; r++) {
            const __m512 xe = _mm512_set1_ps(xr[r * 2 * KP + 2 * kp]), xo = _mm512_set1_ps(xr[r * 2 * KP + 2 * kp + 1]);
            acc[r][0] = _mm512_fmadd_ps(xe, e0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xo, o0, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(xe, e1, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(xo, o1, acc[r][3]);
        }
    }
    const vm m0 = vm_first(cols), m1 = vm_first(cols - 16);
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(out + r * ldo, m0, _mm512_add_ps(acc[r][0], acc[r][1]));
        _mm512_mask_storeu_ps(out + r * ldo + 16, m1, _mm512_add_ps(acc[r][2], acc[r][3]));
    }
}

typedef void (*rows_fn)(const float *, int64_t, const uint16_t *, float *, int64_t, int);
#define ROWS(R) \
    static void rows_##R(const float *xr, int64_t KP, const uint16_t *wt, float *out, int64_t ldo, int cols) { \
        tile_rows(R, xr, KP, wt, out, ldo, cols); \
    }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
static const rows_fn row_blocks[HB_ROWS + 1] = {NULL, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6};
#endif

/* Calls of at least this many rows take the AMX tiles where the CPU has them (0: never). */
static int amx_rows = 1;

/* Sets amx_rows where rows >= 0 and returns it as it is then (for in-process A/B runs). */
int fleet_bf16dot_tuning(int rows) {
    if (rows >= 0) amx_rows = rows;
    return amx_rows;
}

/* 1: the screen runs on AVX512_BF16; 2: on AVX-512 without it (the float32 widening above); 0: not at all. */
int fleet_bf16dot_supported(void) {
#if defined(BF16DOT)
    return 1;
#elif defined(SCREEN)
    return 2;
#else
    return 0;
#endif
}

/* approx [M][N] = bf16(x [M][K]) . w (packed as above; K even). xpairs: scratch of M * K
 * uint32 (x's bf16 pairs, or x's bf16 values as float32). Returns 0, or -1 where the kernel
 * does not run (no AVX-512), -2 for an odd K. */
int fleet_bf16dot(const float *x, int64_t M, int64_t N, int64_t K, const uint16_t *w, uint32_t *xpairs,
                  float *approx, int num_threads) {
#if defined(SCREEN)
    if (K % 2) return -2;
    if (amx_rows > 0 && M >= amx_rows && fleet_bf16dot_amx(x, M, N, K, w, approx, num_threads) == 0) return 0;
    const int64_t KP = K / 2, tiles = (N + TILE - 1) / TILE;
#if defined(BF16DOT)
    for (int64_t i = 0; i < M * KP; i++)
        xpairs[i] = (uint32_t)bf16_bits(x[2 * i]) | (uint32_t)bf16_bits(x[2 * i + 1]) << 16;
    const uint32_t *xs = xpairs;
    const int64_t xstride = KP;
#else
    for (int64_t i = 0; i < M * K; i++) xpairs[i] = (uint32_t)bf16_bits(x[i]) << 16;
    const float *xs = (const float *)xpairs;
    const int64_t xstride = K;
#endif
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < tiles; t++) {
        const uint16_t *wt = w + t * KP * TILE * 2;
        const int cols = tile_cols(N, t);
        for (int64_t r0 = 0; r0 < M; r0 += HB_ROWS) {
            const int R = M - r0 < HB_ROWS ? (int)(M - r0) : HB_ROWS;
            row_blocks[R](xs + r0 * xstride, KP, wt, approx + r0 * N + t * TILE, N, cols);
        }
    }
    return 0;
#else
    (void)x; (void)M; (void)N; (void)K; (void)w; (void)xpairs; (void)approx; (void)num_threads;
    return -1;
#endif
}

/* The largest of a[0, N), and *bad set where any of them is a NaN or an infinity (x - x is
 * NaN exactly there, and a sum that meets a NaN stays NaN). */
static float row_max(const float *a, int64_t N, int *bad) {
    float top = -INFINITY;
    int64_t j = 0;
#if defined(FLEET_SIMD)
    vf vmax = vf_set1(-INFINITY), unord = vf_zero();
    for (; j + 16 <= N; j += 16) {
        const vf v = vf_load(a + j);
        unord = vf_add(unord, vf_sub(v, v));
        vmax = vf_max(vmax, v);
    }
    top = vf_hmax(vmax);
    if (isnan(vf_sum(unord))) *bad = 1;
#endif
    for (; j < N; j++) {
        if (!isfinite(a[j])) *bad = 1;
        if (a[j] > top) top = a[j];
    }
    return top;
}

/* Candidates of each row (see the header): their indices, ascending, into idx[m * cap ..],
 * their number into count[m]. wmax: the largest wnorm. Returns 0; 1 when a row's approx
 * holds a NaN or an infinity, or it has more than cap candidates (the caller then takes the
 * full head). Vector code on AVX-512 and AVX2 (simd.h), else the same loops in scalar: the
 * int8 screen runs wherever linear.c's int8 kernel does. */
int fleet_head_candidates(const float *approx, int64_t M, int64_t N, const float *xnorm, const float *wnorm,
                          float wmax, double c, int64_t cap, int64_t *idx, int64_t *count, int num_threads) {
    int failed = 0;
    #pragma omp parallel for schedule(static) num_threads(num_threads) reduction(| : failed)
    for (int64_t m = 0; m < M; m++) {
        const float *a = approx + m * N;
        count[m] = 0;
        int bad = 0;
        const float top = row_max(a, N, &bad);
        if (bad || !isfinite(top)) { failed = 1; continue; }
        int64_t k = 0;
        while (a[k] != top) k++;
        const double e = c * (double)xnorm[m];
        const double floor_ = (double)top - e * (double)wnorm[k];
        /* A float bound below every candidate (wnorm[j] <= wmax): most of a row is skipped 64
         * values at a time on one vector compare. */
        const float pre = nextafterf((float)(floor_ - e * (double)wmax), -INFINITY);
        int64_t n = 0;
        for (int64_t j = 0; j < N && !failed; j += 64) {
            const int64_t end = N - j < 64 ? N : j + 64;
#if defined(FLEET_SIMD)
            if (end == j + 64) {
                const vf v = vf_max(vf_max(vf_load(a + j), vf_load(a + j + 16)),
                                    vf_max(vf_load(a + j + 32), vf_load(a + j + 48)));
                if (vf_hmax(v) < pre) continue;
            }
#endif
            for (int64_t i = j; i < end; i++) {
                if (a[i] < pre || (double)a[i] + e * (double)wnorm[i] < floor_) continue;
                if (n == cap) { failed = 1; break; }
                idx[m * cap + n++] = i;
            }
        }
        count[m] = failed ? 0 : n;
    }
    return failed;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t u = *(const int64_t *)a, v = *(const int64_t *)b;
    return (u > v) - (u < v);
}

/* |x| of each row of x [M][K] in double, times 1 + 2^-20, rounded to float (as the bound takes
 * it), into xnorm [M]. Returns 0; 1 where a row is not finite or its |x| is below min_norm (the
 * screen cannot decide it). */
int fleet_head_xnorm(const float *x, int64_t M, int64_t K, double min_norm, float *xnorm) {
    for (int64_t m = 0; m < M; m++) {
        double s = 0.;
        for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * (double)x[m * K + k];
        const double norm = sqrt(s);
        if (!isfinite(norm) || norm < min_norm) return 1;
        xnorm[m] = (float)(norm * (1. + 0x1p-20));
    }
    return 0;
}

/* Each row's greedy token from a screen's approx [M][N] (greedy_head.py's GreedyHead.argmax,
 * after the pass): |x| of each row in double (times 1 + 2^-20, rounded to float, as the bound
 * takes it), the candidates (fleet_head_candidates, into idx [M][cap] and count [M]), their
 * union, ascending, the union's columns of w (the head, row-major [N][K] float32) packed as
 * linear.py's pack_f32 packs them and multiplied by fleet_linear's f32 kernel (the bits of the
 * full head's columns: its per-column sums do not depend on the columns a call holds), then
 * each row's largest exact logit, the first of equal ones (the lowest token id, as
 * torch.argmax takes). Returns 0 with tokens [M] set; 1 where the screen cannot decide (a row
 * not finite or with |x| below min_norm, more than cap candidates, a union of more than
 * max_union columns): the caller then takes the full head; 3 where memory ran out. */
int fleet_head_argmax(const float *x, int64_t M, int64_t K, const float *approx, int64_t N, const float *wbound,
                      float wmax, double c, double min_norm, int64_t cap, int64_t max_union, const float *w,
                      int64_t *idx, int64_t *count, float *xnorm, int64_t *tokens, int num_threads) {
    if (fleet_head_xnorm(x, M, K, min_norm, xnorm)) return 1;
    if (fleet_head_candidates(approx, M, N, xnorm, wbound, wmax, c, cap, idx, count, num_threads)) return 1;
    int64_t total = 0;
    for (int64_t m = 0; m < M; m++) total += count[m];
    int64_t *cols = malloc((size_t)(total + 1) * sizeof(int64_t));
    if (!cols) return 3;
    int64_t n = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < count[m]; i++) cols[n++] = idx[m * cap + i];
    qsort(cols, (size_t)n, sizeof(int64_t), cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (!u || cols[i] != cols[u - 1]) cols[u++] = cols[i];
    if (u == 0 || u > max_union) {
        free(cols);
        return 1;
    }
    const int64_t tiles = (u + TILE - 1) / TILE;
    float *packed = calloc((size_t)(tiles * K * TILE), sizeof(float));   /* padding channels zero */
    float *exact = malloc((size_t)(M * u) * sizeof(float));
    int rc = !packed || !exact ? 3 : 0;
    if (!rc) {
        for (int64_t t = 0; t < tiles; t++) {   /* k by k, the tile's rows written in order */
            const float *rows[TILE];
            const int n_cols = tile_cols(u, t);
            for (int j = 0; j < n_cols; j++) rows[j] = w + cols[t * TILE + j] * K;
            float *dst = packed + t * K * TILE;
            for (int64_t k = 0; k < K; k++)
                for (int j = 0; j < n_cols; j++) dst[k * TILE + j] = rows[j][k];
        }
        rc = fleet_linear(FMT_F32, x, M, u, K, 0, packed, NULL, NULL, NULL, exact, num_threads) ? 3 : 0;
    }
    for (int64_t m = 0; !rc && m < M; m++) {
        const float *e = exact + m * u;
        int64_t best = 0;
        for (int64_t j = 1; j < u; j++)
            if (e[j] > e[best]) best = j;
        tokens[m] = cols[best];
    }
    free(exact);
    free(packed);
    free(cols);
    return rc;
}

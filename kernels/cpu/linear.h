/* What the packed-weight matmuls (linear.c, linear_w8a8.c, linear_digits.c, linear_amx.c) share:
 * the tile width, the register block and the masked store of a block's results. */
#ifndef FLEET_LINEAR_H
#define FLEET_LINEAR_H
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define TILE 32        /* output channels per tile of a packed weight */

/* The channels of tile i of an N-channel weight: TILE, or fewer in a last, partial tile. */
static inline int tile_cols(int64_t N, int64_t i) {
    return N - i * TILE < TILE ? (int)(N - i * TILE) : TILE;
}

/* The formats of fleet_linear (linear.py's FORMATS, in order). */
enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_INT8 = 2, FMT_INT4 = 3, FMT_COUNT = 4,
       FMT_INT4Q = 5,  /* int4 packed as vpdpbusd's quads (linear.py's int4 with quads; linear_digits.c) */
       FMT_CODES8 = 8 /* inside linear.c only: per-channel int8 codes, their scale applied after the K sum */ };

/* bf16 calls of at least AMX_ROWS rows and W8A8 calls of at least AMX_W8A8_ROWS go to the AMX
 * tiles where the CPU has them (linear_amx.c; bf16 rounds x to bf16 there); the two return
 * nonzero when they did not run. */
#define AMX_ROWS 16
#define AMX_W8A8_ROWS 32   /* W8A8's VNNI blocks are level with the tiles at 16 rows (0.94-1.01x) */
int fleet_amx_ready(void);
int fleet_amx_rows(void);   /* AMX_ROWS where the AMX path runs, else 0 */
int fleet_linear_amx(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                     float *out, int num_threads);
int fleet_w8a8_amx(const uint8_t *xu, const float *xs, int64_t M, int64_t N, int64_t K, const int8_t *codes,
                   const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads);
/* int8 and int4 calls of at least AMX_SPLIT_ROWS rows run on the AMX tiles too, x and w each
 * carried as two bf16 (hi + lo, about 16 significant bits; linear_amx.c). */
#define AMX_SPLIT_ROWS 16       /* int8; int4 from 32: at 16 rows its AVX-512 path was faster (39.9 vs 43.8 ms) */
#define AMX_SPLIT_ROWS_INT4 32
/* The greedy head's bf16 screen (greedy_head.c) on the tiles: approx [M][N] = bf16(x) . w over
 * greedy_head.py's packed pairs; nonzero when it did not run. */
int fleet_bf16dot_amx(const float *x, int64_t M, int64_t N, int64_t K, const uint16_t *w, float *approx,
                      int num_threads);
int fleet_amx_split_rows(int fmt);   /* the rows from which fmt's calls take the AMX path, else 0 */
int fleet_amx_w8a8_rows(void);       /* the rows from which W8A8 calls (one x scale a row) take it, else 0 */
int fleet_linear_amx_split(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                           const void *scales, const void *mins, const float *bias, float *out, int num_threads);

/* Per-channel int8 calls (fleet_digits_take) of at least fleet_digit_tuning(-1) rows (0: none)
 * on CPUs with AVX512_VNNI and no AMX: x as two bytes a value, integer dot products
 * (linear_digits.c); nonzero when it did not run. int4 in groups of a multiple of 32 is packed
 * as quads there (fleet_int4_quads: x's group, 0 where it is not) and every call over it runs
 * fleet_linear_quads, the same products. */
int fleet_linear_digits(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                        const void *scales, const void *mins, const float *bias, float *out, int num_threads);
int fleet_digits_take(int fmt, int64_t K, int64_t G);   /* x's group (64 or 32), 0: not taken */
int fleet_int4_quads(int64_t K, int64_t G);
int fleet_linear_quads(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                       const void *scales, const void *mins, const float *bias, float *out, int num_threads);
int fleet_digit_tuning(int rows);
int fleet_quads_prefetch(int bytes);   /* int4 quads' prefetch distance (linear_digits.c) */
int fleet_quads_split(int rows);       /* from how many rows int4 quads split nibbles into a buffer */
int fleet_cpu_is_intel(void);

#if defined(FLEET_AVX512)
#define RB 8           /* rows per register block (32 zmm registers) */
/* Accumulator sets for a block of R rows (independent chains of fused multiply-adds; S x R <= RB).
 * One row keeps four (eight chains); from two rows on a row is one chain, as in every larger
 * block, so an f32 row gets the same bits in calls of 2 rows as in a prefill call. Two sets
 * for 2-4 rows had been meant to keep the FMA units busy, but those calls wait on the
 * weights' stream, not on the chains: Intel Xeon family 6 model 167, the engine's decode
 * steps (`decode_profile`, medians, two processes alternating, old/new/new/old) at 2 / 3 / 4
 * rows: fp32 22.2-24.2 / 22.6-25.4 / 24.1-27.0 -> 20.6-21.3 / 20.1-20.6 / 21.1-21.9 ms, int8
 * per channel 8.7-9.5 / 10.6-11.1 / 12.9 -> 5.9 / 6.9-7.1 / 7.3-8.3, int8-g64 at 2 / 4 rows 8.9 /
 * 12.3-13.0 -> 6.2-6.5 / 7.9-9.1 (a C harness with the 120 f32 projections swept: 0.83-0.95x). */
#define SETS(R) ((R) == 1 ? 4 : 1)
#define SETS_INT4(R) ((R) == 1 ? 4 : (R) == 2 ? 2 : 1)
#elif defined(FLEET_AVX2)
#define RB 3           /* 16 ymm registers: a vf of 16 floats takes two */
#define SETS(R) ((R) == 1 ? 2 : 1)
#endif

#if defined(FLEET_SIMD)
/* Passes of near-equal size over a tile's M rows (8 rows as 4 + 4, not 6 + 2: a short pass
 * runs few independent chains): the rows of pass p, r0 rows of M already taken. */
AI int pass_rows(int64_t M, int64_t r0, int64_t passes, int64_t p) {
    return (int)((M - r0 + passes - p - 1) / (passes - p));
}

/* Each of `passes` passes prefetches its share of the next `bytes` (the thread's next tile),
 * spread over its K steps: the share's start is next + p * share, pf_step(share, K) bytes a k. */
AI int64_t pass_share(int64_t bytes, int64_t passes) { return (bytes + passes - 1) / passes; }
AI int64_t pf_step(int64_t share, int64_t K) { return (share + K - 1) / K; }

/* Software prefetch beside a tile's k loop. A block of RB rows waits on the tile's stream,
 * and the row blocks after the first read the tile from L2 (or the decoded buffer) while
 * memory idles; so each full block b fetches its share of the thread's next tile (which
 * follows this one), a lone block of RB rows runs PF_AHEAD bytes ahead of its own stream,
 * and fewer rows than RB (bound by the stream alone, which the hardware prefetchers keep up
 * with) prefetch nothing. In-process A/B on a 2-core AMD EPYC Zen 5, cold weights, SmolLM2's
 * four projection shapes, per 30 layers: 8-64 rows 0.5-0.9x the time (f32 16 rows 13.2 ->
 * 10.1 ms, int8 8 rows 7.9 -> 4.2, bf16 16 rows 17.9 -> 10.2), 1-6 and 256-1,024 rows level.
 * Past CONTIGUOUS_ROWS the tiles go to the threads one at a time instead (linear.c,
 * tile_chunk), which a prefetch of "the next tile" cannot follow. A later A/B on the same
 * kind of CPU, f32 (mm harness in /tmp, alternating, medians of 5): with the limit at 48 rows
 * rather than 256, 56-128 rows 0.87-0.96x the time, 256 rows 0.8-0.94x, up to 48 rows level;
 * int8 at 64 / 128 rows 0.91x / 0.88x, int4 0.98x / 0.92x. */
#define PF_AHEAD 8192
/* Up to this many rows the row blocks prefetch the next tile and a thread's tiles follow one
 * another; past it a tile's compute hides its fetch. */
#define CONTIGUOUS_ROWS 48
/* AVX2's 3-row blocks ran 8-16 rows 1.2-1.4x slower with it (the AVX2 build on the same Zen 5,
 * f32/int8/int4), 1-4 rows level: off there. */
#if defined(FLEET_AVX512)
#define PF_ON 1
#else
#define PF_ON 0
#endif
/* Where the prefetches go (linear.c, once per process): 0, into L1, as measured on AMD;
 * 1, into L2 only, and a call of 2 .. RB - 1 rows runs PF_FAR bytes ahead of its own stream
 * too. 1 on Intel CPUs (fleet_linear_tuning sets it: linear.py's `tuning`). Measured on a 2-core Intel Xeon
 * with AMX (`fleet bench linear`, SmolLM2's five shapes summed, l1 vs l2, two runs each):
 * 2-4 rows 0.80-0.88x the time for f32, bf16, int8 and W8A8, int4-g32 at 4 rows 0.44x (3.6 ->
 * 1.6 ms: it had been slower than 8 rows), f32 at 8 rows 0.86x, 1 and 16-32 rows level; the
 * throughput workload 1.06x tokens/s (189 -> 200, medians of 6 runs, alternating processes).
 * On AMD Zen 5 a 4-row block prefetching into L1 had been up to 1.4x slower: AMD keeps 0. */
int fleet_prefetch_far(void);
#define PF_FAR 32768
/* One row, with the one_row_prefetch tuning on (linear.c): a bf16 or int8 stream (32 or 64
 * bytes a k) prefetches PF_ONE_K k ahead of itself into L1 (8 and 4 KiB). So few instructions
 * a byte leave those streams waiting on the hardware prefetchers, which keep up with f32's two
 * lines a k. Measured on a 2-core Intel Xeon (family 6 model 207, AMX exposed), SmolLM2's
 * 120 projections at one row, alternating, medians of 15-21, weights swept out of the caches
 * before each pass: int8 per channel 0.65-0.80x the time, bf16 0.73-0.78x, int4-g64
 * 0.75-0.85x, f32 1.09x; with the weights left in this VM's large L3 between passes: int8
 * 0.92-1.25x, bf16 0.66-0.76x, int4 1.10-1.43x (and in the engine, whose 53 MB of int4 layers
 * stay there between steps, batch-1 int4 steps 1.2x the time). So f32 and int4 keep none there. AVX2 builds (measured on AMD
 * Zen 3: kernels/README.md) take it in linear.c's one-row int8 and int4 routines and W8A8's
 * blocks (int8 per channel 0.83x the time, int4 0.76x, W8A8 0.92x), not in span (bf16 and
 * grouped int8 at one row: level or slower with it). */
#define PF_ONE_K 128
#if defined(FLEET_AVX2)
#define PF_ONE_MIN (TILE / 2)   /* int4's 16 bytes a k too */
#else
#define PF_ONE_MIN TILE
#endif
int fleet_prefetch_one_row(void);
int fleet_codes_halves(int on);   /* AVX2: int8 / int4 tiles in halves decoded in registers (linear.c); -1 asks */
typedef struct {
    const char *p;   /* what goes with k = 0, or NULL */
    int64_t step;    /* bytes a k */
    int far;         /* into L2 (fleet_prefetch_far), else L1 */
} pf_t;

AI pf_t pf_plan(const char *own, int64_t bytes, int64_t K, int64_t M, int64_t b) {
    const int64_t full = M / RB;   /* blocks of RB rows; a last, smaller one prefetches nothing */
    const int64_t step = bytes / K;
    const int far = PF_ON ? fleet_prefetch_far() : 0;
    if (far && M > 1 && M < RB) return (pf_t){own + PF_FAR, step, 1};
    if (M == 1 && step >= PF_ONE_MIN && step < 4 * TILE && fleet_prefetch_one_row())   /* bf16, int8 (int4) */
        return (pf_t){own + PF_ONE_K * step, step, 0};
    if (!PF_ON || b >= full || M > CONTIGUOUS_ROWS) return (pf_t){NULL, 0, 0};
    if (M == RB) return (pf_t){own + PF_AHEAD, step, far};
    const int64_t chunk = pass_share(bytes, full);
    return (pf_t){own + bytes + b * chunk, pf_step(chunk, K), far};
}

/* The lines that go with k .. k + n - 1 (at least one); pf.p is not NULL. */
AI void pf_k(pf_t pf, int64_t k, int n) {
    const char *a = pf.p + k * pf.step;
    if (pf.far)
        for (int64_t o = 0; o < n * pf.step; o += 64) _mm_prefetch(a + o, _MM_HINT_T2);
    else
        for (int64_t o = 0; o < n * pf.step; o += 64) _mm_prefetch(a + o, _MM_HINT_T0);
}

/* out[r][0..cols) = acc[r] (+ bias) for R rows; cols <= TILE. */
AI void store_rows(const int R, vf acc[RB][2], const float *bias, float *out, int64_t ldo, int cols) {
    if (cols == TILE) {   /* whole tiles without masks (AVX2's masked moves are slow) */
        for (int h = 0; h < 2; h++) {
            const vf b = bias ? vf_load(bias + 16 * h) : vf_zero();
            for (int r = 0; r < R; r++) vf_store(out + r * ldo + 16 * h, vf_add(acc[r][h], b));
        }
        return;
    }
    const vm mask[2] = {vm_first(cols), vm_first(cols - 16)};
    for (int h = 0; h < 2; h++) {
        const vf b = bias ? vf_load_mask(bias + 16 * h, mask[h]) : vf_zero();
        for (int r = 0; r < R; r++) vf_store_mask(out + r * ldo + 16 * h, mask[h], vf_add(acc[r][h], b));
    }
}
#endif

#if defined(FLEET_AVX512)
/* The integer dot-product kernels (linear_w8a8.c, linear_digits.c): y[r] += (acc[r] - comp) *
 * xs[r * stride] for R rows of one group's int32 sums over a tile (comp: the group's 32
 * offsets), then y[r] *= the tile's 32 channel scales. */
AI void fold_group(const int R, __m512i (*acc)[2], const int32_t *comp, const float *xs, int64_t stride,
                   vf y[RB][2]) {
    for (int h = 0; h < 2; h++) {
        const __m512i c = _mm512_loadu_si512(comp + 16 * h);
        for (int r = 0; r < R; r++)
            y[r][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], c)), _mm512_set1_ps(xs[r * stride]),
                                      y[r][h]);
    }
}

#if defined(__AVX512VNNI__)
/* The same kernels' k loop: acc[r] += the integer dot products (vpdpbusd) of R rows of x's
 * unsigned bytes xu (row stride K) with a tile's codes w ([K/4][32][4]) over k0 .. k1. */
AI void dot_span(const int R, const uint8_t *xu, int64_t K, const int8_t *w, int64_t k0, int64_t k1,
                 __m512i acc[RB][2], pf_t pf, const int use_pf) {
    for (int64_t k = k0; k < k1; k += 4) {
        if (use_pf) pf_k(pf, k, 4);
        const __m512i w0 = _mm512_loadu_si512(w + k * TILE), w1 = _mm512_loadu_si512(w + k * TILE + 64);
        for (int r = 0; r < R; r++) {
            const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(xu + r * K + k));
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], xb, w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], xb, w1);
        }
    }
}
#endif

AI void scale_rows(const int R, vf y[RB][2], const float *scale) {
    for (int h = 0; h < 2; h++) {
        const vf s = vf_load(scale + 16 * h);
        for (int r = 0; r < R; r++) y[r][h] = vf_mul(y[r][h], s);
    }
}
#endif
#endif

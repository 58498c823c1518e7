/* y = x W^T (+ b) over weights packed by kernels/cpu/linear.py: fp32, bf16, int8 and int4,
 * each read in its own bytes and dequantized in registers, accumulated in float32.
 *
 * The weight comes in tiles of TILE = 32 output channels, K-major inside a tile (one
 * contiguous stream per tile; see linear.py for each format's bytes). Work is split over
 * OpenMP threads by tile. Inside a tile, rows go in register blocks of up to RB (8 with
 * AVX-512, 3 with AVX2; linear.h): RB x 32 accumulators, each weight vector decoded once
 * per block and multiplied into every row with x broadcast from memory. With at most RB
 * rows every weight byte is read once and decoded once. f32 past RB rows (AVX-512) goes in
 * passes of up to WB = 12 rows, one chain a row (f32_tile_wide). With more rows, a quantized or bf16
 * tile is first decoded into a per-thread float32 buffer of the fp32 layout ([K][32], in
 * L2), which the passes of up to WB rows then read as they read an f32 tile, each a share of
 * the thread's next packed tile prefetched (tile_wide; AVX2: half a tile at a time,
 * f32_tile_rows, which f32 tiles take too past HALF_ROWS rows, copied into the buffer). The
 * decoded tiles had gone in blocks of RB rows with nothing prefetched, the decode waiting on
 * memory and the blocks on the FMA units in turn: 2-core AMD EPYC Zen 4, the 120 projections
 * of a decode step (weights cold), two processes old/new/new/old, medians of 9:
 * int8 per channel at 9 / 32 / 64 rows 15.9-16.1 / 39.8-44.6 / 70.8-75.5 -> 14.8-15.5 /
 * 38.9-39.9 / 70.2-72.7 ms, int4-g64 16.0-16.2 / 39.8-43.6 / 69.2-72.2 -> 14.9-15.0 / 38.7-38.8
 * / 68.1-68.2 ms (paired: 0.92-0.96x at 9 rows, 0.89-0.98x at 32, 0.93-1.03x at 64). A call
 * ending in a lone row now gives it one chain, not four.
 *
 * Numerics: int8 weights are q * scale (per-channel int8 at most RB rows: the codes' sum
 * over k, times the scale once), int4 q * scale + min in one fused multiply-add, bf16 exact;
 * sums in float32 in k order. Results differ from dequantize-then-F.linear by
 * float32 rounding only.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "linear.h"
#include "tile_decode.h"

#if defined(FLEET_SIMD)
#include <cpuid.h>

/* The CPU is Intel's (cpuid's vendor string), where the two tunings below were measured. */
int fleet_cpu_is_intel(void) {
    unsigned a, b, c, d;
    char vendor[13] = {0};
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    return !strcmp(vendor, "GenuineIntel");
}

/* The four tunings (linear.h, and wide_prefetch below): -1 until first asked, then 0 / 1;
 * fleet_linear_tuning sets them. */
static int tune_far = -1, tune_pairs = -1, tune_wide = -1, tune_one = -1;

int fleet_prefetch_far(void) {
    if (tune_far < 0) tune_far = fleet_cpu_is_intel();   /* a race computes the same answer twice */
    return tune_far;
}

/* One-row streams prefetch ahead of themselves (linear.h, PF_ONE_K: bf16 and int8; in AVX2
 * builds int8, int4 and W8A8): on Intel CPUs and in AVX2 builds, where it was measured
 * faster. Off on AMD CPUs with AVX-512: on Zen 4 (family 25 model 17) it made one-row int8
 * calls 1.30x the time, bf16 1.03x, int8-g64 1.15x, batch-1 int8 engine steps 1.18x
 * (kernels/README.md, 2026-12-07). */
static int one_row_default(void) {
#if defined(FLEET_AVX2)
    return 1;
#else
    return fleet_cpu_is_intel();
#endif
}

int fleet_prefetch_one_row(void) {
    if (tune_one < 0) tune_one = one_row_default();
    return tune_one;
}

#if defined(FLEET_AVX512)
/* f32 calls past CONTIGUOUS_ROWS in the two-tile blocks (f32_pairs): on Intel CPUs, where they
 * were measured faster; on AMD Zen 4 (family 25 model 17) level with the 8 x 32 blocks, 1.00-1.04x
 * the time at 64-1,024 rows but 0.92x at 256 (kernels/README.md, 2026-12-07), so off there. */
static int f32_pairs_on(void) {
    if (tune_pairs < 0) tune_pairs = fleet_cpu_is_intel();
    return tune_pairs;
}
#endif

#if defined(FLEET_AVX512)
/* Whether the f32 passes of WIDE_PF_ROWS to CONTIGUOUS_ROWS rows prefetch the thread's next tile
 * (tile_wide): on Intel CPUs, where that prefetch was measured; on AMD only up to WIDE_PF_ROWS. */
static int wide_prefetch_all(void) {
    if (tune_wide < 0) tune_wide = fleet_cpu_is_intel();
    return tune_wide;
}
#endif

/* Sets the tunings (each 0 or 1; -1: this CPU's default; -2: as it is) and returns them as
 * far + 2 * pairs + 4 * wide + 8 * one. For A/B measurements and the tests: they change
 * speed only, not results. */
int fleet_linear_tuning(int far, int pairs, int wide, int one) {
    if (far > -2) tune_far = far < 0 ? fleet_cpu_is_intel() : far;
    if (pairs > -2) tune_pairs = pairs < 0 ? fleet_cpu_is_intel() : pairs;
    if (wide > -2) tune_wide = wide < 0 ? fleet_cpu_is_intel() : wide;
    if (one > -2) tune_one = one < 0 ? one_row_default() : one;
#if defined(FLEET_AVX512)
    return fleet_prefetch_far() + 2 * f32_pairs_on() + 4 * wide_prefetch_all() + 8 * fleet_prefetch_one_row();
#else
    return 8 * fleet_prefetch_one_row();   /* AVX2's blocks prefetch nothing else (PF_ON) and it has no pairs */
#endif
}

/* acc[r] += x[r][k] * w for the block's R rows. */
AI void fma_rows(const int R, vf acc[RB][2], const float *x, int64_t ldx, int64_t k, const vf *w) {
    for (int r = 0; r < R; r++) {
        const vf xb = vf_set1(x[r * ldx + k]);
        acc[r][0] = vf_fmadd(xb, w[0], acc[r][0]);
        acc[r][1] = vf_fmadd(xb, w[1], acc[r][1]);
    }
}

/* Rows k0 <= k < k1 of the tile into S accumulator sets (k rotates over the sets), so that
 * a block of few rows still has S x R independent chains of fused multiply-adds. */
AI void span(const int fmt, const int pf, const int R, const int S, vf acc[RB][2], const float *x, int64_t ldx,
             const tile_t *t, int64_t k0, int64_t k1, const vf s[2], const vf m[2]) {
    vf w[4];
    const int step = fmt == FMT_INT4 ? 2 : 1;   /* k per decode */
    const int64_t unroll = S > step ? S : step;
    int64_t k = k0;
    for (; k + unroll <= k1; k += unroll) {
        for (int j = 0; j < unroll; j += step) {
            decode(fmt, pf, t, k + j, s, m, w);
            for (int h = 0; h < step; h++) fma_rows(R, acc + (j + h) % S * R, x, ldx, k + j + h, w + 2 * h);
        }
    }
    for (; k < k1; k += step) {
        decode(fmt, pf, t, k, s, m, w);
        for (int h = 0; h < step; h++) fma_rows(R, acc, x, ldx, k + h, w + 2 * h);
    }
}

#if defined(FLEET_AVX2)
/* One row of per-channel int8 codes (AVX2): k in pairs over two accumulator sets held in
 * locals (through span GCC kept a set in memory, a store and a reload a k: kernels/README.md),
 * and where the call prefetches (pf_plan's one-row stream) a line a pair, PF_ONE_K k ahead. */
AI void codes8_row(const int pf, vf acc[RB][2], const float *x, const tile_t *t) {
    const int64_t K = t->k;
    const int8_t *c = t->data;
    vf a0 = acc[0][0], a1 = acc[0][1], b0 = acc[1][0], b1 = acc[1][1];
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        if (pf) _mm_prefetch(t->pf.p + k * TILE, _MM_HINT_T0);   /* a pair's 64 bytes */
        const vf xa = vf_set1(x[k]), xb = vf_set1(x[k + 1]);
        a0 = vf_fmadd(xa, vf_from_i8(c + k * TILE), a0);
        a1 = vf_fmadd(xa, vf_from_i8(c + k * TILE + 16), a1);
        b0 = vf_fmadd(xb, vf_from_i8(c + (k + 1) * TILE), b0);
        b1 = vf_fmadd(xb, vf_from_i8(c + (k + 1) * TILE + 16), b1);
    }
    if (k < K) {
        const vf xa = vf_set1(x[k]);
        a0 = vf_fmadd(xa, vf_from_i8(c + k * TILE), a0);
        a1 = vf_fmadd(xa, vf_from_i8(c + k * TILE + 16), a1);
    }
    acc[0][0] = a0, acc[0][1] = a1, acc[1][0] = b0, acc[1][1] = b1;
}

/* One row over int4 codes (AVX2): accumulate_int4_folded's sums (the even k of a group in
 * one set, the odd k in the other, the group's scale and min applied after its sum), held in
 * locals rather than in the block's array, where GCC kept a set in memory; the same bits. */
AI void nibbles_row(const int pf, vf acc[RB][2], const float *x, const tile_t *t) {
    const int64_t K = t->k, G = t->group;
    const uint8_t *c = t->data;
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        vf e0 = vf_zero(), e1 = vf_zero(), o0 = vf_zero(), o1 = vf_zero(), lo, hi, s[2], m[2];
        const uint8_t *b = c + k0 / 2 * TILE;   /* 32 bytes a k pair */
        for (int64_t k = k0; k < k0 + G; k += 2, b += TILE) {
            if (pf) _mm_prefetch(t->pf.p + (b - c), _MM_HINT_T0);   /* as codes8_row */
            const vf xe = vf_set1(x[k]), xo = vf_set1(x[k + 1]);
            vf_from_nibbles(b, &lo, &hi);
            e0 = vf_fmadd(xe, lo, e0);
            o0 = vf_fmadd(xo, hi, o0);
            vf_from_nibbles(b + 16, &lo, &hi);
            e1 = vf_fmadd(xe, lo, e1);
            o1 = vf_fmadd(xo, hi, o1);
        }
        group_scales(FMT_INT4, t, g, s, m);
        const vf xs = vf_set1(t->xsum[g]);
        acc[0][0] = vf_fmadd(xs, m[0], vf_fmadd(vf_add(e0, o0), s[0], acc[0][0]));
        acc[0][1] = vf_fmadd(xs, m[1], vf_fmadd(vf_add(e1, o1), s[1], acc[0][1]));
    }
}
#else
/* int4 for a block of at most RB / 2 rows (AVX-512; on AVX2 that is the one row nibbles_row
 * takes): per group, p = sum of x * q (the bare codes, in sets as in span), then
 * acc += scale * p + min * sum of x; fewer operations per byte than dequantizing each weight. */
AI void accumulate_int4_folded(const int pf, const int R, vf acc[RB][2], const float *x, int64_t ldx,
                                const tile_t *t) {
    const int S = SETS_INT4(R);
    const int64_t K = t->k, G = t->group;
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        vf p[RB][2], s[2], m[2], w[4];
        for (int r = 0; r < S * R; r++) p[r][0] = p[r][1] = vf_zero();
        for (int64_t k = k0; k < k0 + G; k += 2 * S) {
            for (int j = 0; j < 2 * S; j += 2) {
                const uint8_t *b = (const uint8_t *)t->data + (k + j) / 2 * TILE;
                if (pf) pf_k(t->pf, k + j, 2);
                for (int h = 0; h < 2; h++) vf_from_nibbles(b + 16 * h, &w[h], &w[2 + h]);
                fma_rows(R, p + j % S * R, x, ldx, k + j, w);
                fma_rows(R, p + (j + 1) % S * R, x, ldx, k + j + 1, w + 2);
            }
        }
        group_scales(FMT_INT4, t, g, s, m);
        for (int r = 0; r < R; r++) {
            const vf xs = vf_set1(t->xsum[r * (K / G) + g]);
            for (int h = 0; h < 2; h++) {
                for (int j = 1; j < S; j++) p[r][h] = vf_add(p[r][h], p[j * R + r][h]);
                acc[r][h] = vf_fmadd(xs, m[h], vf_fmadd(p[r][h], s[h], acc[r][h]));
            }
        }
    }
}
#endif

/* The accumulators of R rows over one tile, every k, weights decoded from fmt; acc holds
 * RB rows, of which S x R <= RB serve as S sets, summed into the first R at the end. */
AI void accumulate(const int fmt, const int pf, const int R, vf acc[RB][2], const float *x, int64_t ldx,
                   const tile_t *t) {
    const int S = SETS(R);
    vf s[2], m[2];
#if defined(FLEET_AVX2)
    /* AVX2 prefetches only in the one-row routines; a one-row bf16 or grouped int8 stream
     * through span measured level with it or slower (kernels/README.md). */
    const int span_pf = 0;
    if (fmt == FMT_INT4 && R == 1) {
        nibbles_row(pf, acc, x, t);
        return;
    }
#else
    const int span_pf = pf;
    if (fmt == FMT_INT4 && R <= RB / 2) {
        accumulate_int4_folded(pf, R, acc, x, ldx, t);
        return;
    }
#endif
    const int64_t K = t->k, G = fmt >= FMT_INT8 ? t->group : t->k;
    const int channel = fmt == FMT_INT8 && G == K;   /* per-channel int8: the scale factors out of the sum */
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        if (channel) {
#if defined(FLEET_AVX2)
            if (R == 1 && S == 2) {
                codes8_row(pf, acc, x, t);
                break;
            }
#endif
            span(FMT_CODES8, span_pf, R, S, acc, x, ldx, t, 0, K, s, m);
            break;
        }
        group_scales(fmt, t, g, s, m);
        span(fmt, span_pf, R, S, acc, x, ldx, t, k0, k0 + G, s, m);
    }
    for (int j = 1; j < S; j++)
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) acc[r][h] = vf_add(acc[r][h], acc[j * R + r][h]);
    if (channel) {
        load_pair(t->scales, s);   /* per-channel int8: float32 */
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) acc[r][h] = vf_mul(acc[r][h], s[h]);
    }
}

typedef void (*block_fn)(const float *x, int64_t ldx, const tile_t *t, const float *bias, float *out,
                         int64_t ldo, int cols);

#define BLOCK(FMT, R)                                                                             \
    static void block_##FMT##_##R(const float *x, int64_t ldx, const tile_t *t, const float *bias, \
                                  float *out, int64_t ldo, int cols) {                           \
        vf acc[RB][2];                                                                            \
        for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = vf_zero();                           \
        if (t->pf.p) accumulate(FMT, 1, R, acc, x, ldx, t); /* two copies: no test in the k loop */  \
        else accumulate(FMT, 0, R, acc, x, ldx, t);                                               \
        store_rows(R, acc, bias, out, ldo, cols);                                                 \
    }
#define BLOCKS4(FMT) BLOCK(FMT, 1) BLOCK(FMT, 2) BLOCK(FMT, 3) BLOCK(FMT, 4)
#define TABLE4(FMT) NULL, block_##FMT##_1, block_##FMT##_2, block_##FMT##_3, block_##FMT##_4
#if RB == 8
#define BLOCKS(FMT) BLOCKS4(FMT) BLOCK(FMT, 5) BLOCK(FMT, 6) BLOCK(FMT, 7) BLOCK(FMT, 8)
#define TABLE(FMT) {TABLE4(FMT), block_##FMT##_5, block_##FMT##_6, block_##FMT##_7, block_##FMT##_8}
#elif RB == 4
#define BLOCKS(FMT) BLOCKS4(FMT)
#define TABLE(FMT) {TABLE4(FMT)}
#else
#define BLOCKS(FMT) BLOCK(FMT, 1) BLOCK(FMT, 2) BLOCK(FMT, 3)
#define TABLE(FMT) {NULL, block_##FMT##_1, block_##FMT##_2, block_##FMT##_3}
#endif
BLOCKS(FMT_F32) BLOCKS(FMT_BF16) BLOCKS(FMT_INT8) BLOCKS(FMT_INT4)
static const block_fn blocks[FMT_COUNT][RB + 1] = {TABLE(FMT_F32), TABLE(FMT_BF16), TABLE(FMT_INT8),
                                                   TABLE(FMT_INT4)};

#if defined(FLEET_AVX2)
/* More rows than RB over an f32 tile (AVX2): half a tile (16 channels, one vf) at a time, in
 * blocks of up to HB rows. A 3-row block of the whole tile takes every weight vector as a
 * memory operand of each row's FMAs, 15 loads per 12 FMAs, which bounds it below the FMA
 * rate; here each k loads the half's weights once for all the block's rows (8 loads per 12
 * FMAs at 6 rows). Each output is still one chain of fused multiply-adds in k order, as in a
 * block of RB rows. */
#define HB 6
/* Up to HALF_ROWS rows the 3-row blocks read an f32 tile in place (one contiguous pass);
 * past it the tile is first copied into the L2 buffer (read by halves straight from memory it
 * streamed at a third of the rate), and the halves prefetch the next tile while they compute.
 * A decoded tile (bf16, int8, int4) is in the buffer from RB + 1 rows on and always read by
 * the halves. The results change only where a call ends in a lone row (the 3-row path's
 * single row sums in two chains, a half's in one).
 *
 * Measured on a 2-core AMD EPYC Zen 3 (family 25 model 1), in-process A/B of two builds,
 * SmolLM2's 120 projections (30 random layers, cold), alternating, medians of 7-11
 * (2026-12-07). Each k's weights had been a memory operand of every row's FMA in the blocks
 * of 1-5 rows (GCC folded the load; 6 kept them in registers): now one load (VF_IN_REG), the
 * blocks of near-equal size, and the next tile prefetched up to CONTIGUOUS_ROWS rows
 * (prefetch alone: int8 at 5-48 rows 0.89-0.98x the time, 32 rows 1.02x). All three against
 * the code before: int8 per channel at 5 / 8 / 12 / 16 / 24 / 32 / 48 / 64 rows 0.91x / 0.86x
 * / 0.91x / 0.85x / 0.96x / 0.89x / 0.91x / 0.98x, int4-g64 0.89x / 0.89x / 0.97x / 0.88x /
 * 0.98x / 0.90x / 1.04x / 0.99x, bf16 0.82x / 0.68x / 0.89x / 0.92x / 0.90x / 0.93x / 0.88x /
 * 0.89x, f32 at 24 / 32 / 48 / 64 rows 0.89x / 0.93x / 0.95x / 0.91x. With that, the halves
 * took over more calls: decoded tiles at 4 rows (they had kept the 3-row blocks, 1.04-1.12x
 * faster than the halves with the folded loads) 0.85x int8, 0.79x int4-g64, 0.84x bf16; f32
 * past 4 rows rather than 16: 7 / 8 / 9 / 12 / 16 rows 0.87x / 0.85x / 0.85x / 0.79x / 0.75x,
 * 5 and 6 rows level, 4 rows 1.13x (so 4 keep the blocks). */
#define HALF_ROWS 4

/* out[r][0..cols) = acc[r] (+ bias) for R rows of half a tile (cols <= 16 of its channels). */
AI void store_half(const int R, const vf *acc, const float *bias, float *out, int64_t ldo, int cols) {
    const vm mask = vm_first(cols);
    const vf b = bias ? vf_load_mask(bias, mask) : vf_zero();
    for (int r = 0; r < R; r++) {
        if (cols >= 16) vf_store(out + r * ldo, vf_add(acc[r], b));
        else vf_store_mask(out + r * ldo, mask, vf_add(acc[r], b));
    }
}

AI void half_rows(const int R, const float *x, int64_t ldx, const float *w, int64_t K, const float *bias,
                  float *out, int64_t ldo, int cols, const int pf, const char *pfa, int64_t pfstep) {
    vf acc[HB];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t k = 0; k < K; k++) {
        if (pf)
            for (int64_t o = 0; o < pfstep; o += 64) _mm_prefetch(pfa + k * pfstep + o, _MM_HINT_T1);
        vf wk = vf_load(w + k * TILE);
        VF_IN_REG(wk);   /* one load a k, not one a row's FMA */
        for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_set1(x[r * ldx + k]), wk, acc[r]);
    }
    store_half(R, acc, bias, out, ldo, cols);
}

typedef void (*half_fn)(const float *, int64_t, const float *, int64_t, const float *, float *, int64_t, int,
                        const char *, int64_t);
#define HALF(R)                                                                                    \
    static void half_##R(const float *x, int64_t ldx, const float *w, int64_t K, const float *bias, \
                         float *out, int64_t ldo, int cols, const char *pfa, int64_t pfstep) {    \
        if (pfa) half_rows(R, x, ldx, w, K, bias, out, ldo, cols, 1, pfa, pfstep);                \
        else half_rows(R, x, ldx, w, K, bias, out, ldo, cols, 0, NULL, 0);                        \
    }
HALF(1) HALF(2) HALF(3) HALF(4) HALF(5) HALF(6)
static const half_fn halves[HB + 1] = {NULL, half_1, half_2, half_3, half_4, half_5, half_6};

/* R rows of x against half h (channels 16 h ..) of a packed int8 or int4 tile, each k's 16
 * weights decoded in registers by decode_tile's own steps (tile_decode.h's int8_half and
 * int4_half) and multiplied into every row of the block:
 * half_rows' products on decode_tile's weights, so the same bits, without the buffer. */
AI void half_codes(const int fmt, const int R, const float *x, int64_t ldx, const tile_t *t, const int h,
                   const float *bias, float *out, int64_t ldo, int cols, const int pf, const char *pfa,
                   int64_t pfstep) {
    const int64_t K = t->k, G = t->group;
    vf acc[HB];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        vf s = vf_zero(), m = vf_zero();
        if (fmt == FMT_INT8) s = vf_load((const float *)t->scales + g * TILE + 16 * h);
        if (fmt == FMT_INT4) {
            s = vf_from_f16((const uint16_t *)t->scales + g * TILE + 16 * h);
            m = vf_from_f16((const uint16_t *)t->mins + g * TILE + 16 * h);
        }
        for (int64_t k = k0; k < k0 + G; k += fmt == FMT_INT4 ? 2 : 1) {
            if (pf)
                for (int64_t o = 0; o < pfstep; o += 64) _mm_prefetch(pfa + k * pfstep + o, _MM_HINT_T1);
            vf w0, w1 = vf_zero();
            if (fmt == FMT_INT8) w0 = int8_half((const int8_t *)t->data + k * TILE + 16 * h, s);
            else int4_half((const uint8_t *)t->data + k / 2 * TILE + 16 * h, s, m, &w0, &w1);
            VF_IN_REG(w0);
            for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_set1(x[r * ldx + k]), w0, acc[r]);
            if (fmt == FMT_INT4) {
                VF_IN_REG(w1);
                for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_set1(x[r * ldx + k + 1]), w1, acc[r]);
            }
        }
    }
    store_half(R, acc, bias, out, ldo, cols);
}

typedef void (*code_fn)(const float *, int64_t, const tile_t *, int, const float *, float *, int64_t, int,
                        const char *, int64_t);
#define CODES(FMT, R)                                                                                       \
    static void codes_##FMT##_##R(const float *x, int64_t ldx, const tile_t *t, int h, const float *bias,   \
                                  float *out, int64_t ldo, int cols, const char *pfa, int64_t pfstep) {     \
        if (pfa) half_codes(FMT, R, x, ldx, t, h, bias, out, ldo, cols, 1, pfa, pfstep);                     \
        else half_codes(FMT, R, x, ldx, t, h, bias, out, ldo, cols, 0, NULL, 0);                             \
    }
#define CODES6(FMT) CODES(FMT, 1) CODES(FMT, 2) CODES(FMT, 3) CODES(FMT, 4) CODES(FMT, 5) CODES(FMT, 6)
#define CODE_TABLE(FMT) {NULL, codes_##FMT##_1, codes_##FMT##_2, codes_##FMT##_3, codes_##FMT##_4, \
                         codes_##FMT##_5, codes_##FMT##_6}
CODES6(FMT_INT8) CODES6(FMT_INT4)
static const code_fn code_halves[2][HB + 1] = {CODE_TABLE(FMT_INT8), CODE_TABLE(FMT_INT4)};

/* All M rows of x against packed tile t (int8, int4), half a tile at a time in blocks of
 * near-equal size, as f32_tile_rows runs them over the decoded buffer, and with its prefetch. */
static void codes_tile_rows(int fmt, const float *x, int64_t M, const tile_t *t, const float *bias, float *out,
                            int64_t ldo, int cols, const char *next, int64_t next_bytes) {
    const int64_t K = t->k, blocks = (M + HB - 1) / HB, passes = (cols > 16 ? 2 : 1) * blocks;
    const int64_t share = pass_share(next_bytes, passes), pfstep = pf_step(share, K);
    for (int h = 0, p = 0; h < 2 && 16 * h < cols; h++)
        for (int64_t b = 0, r0 = 0; b < blocks; b++, p++) {
            const int R = pass_rows(M, r0, blocks, b);
            code_halves[fmt == FMT_INT4][R](x + r0 * K, K, t, h, bias ? bias + 16 * h : NULL,
                                            out + r0 * ldo + 16 * h, ldo, cols - 16 * h,
                                            next ? next + p * share : NULL, pfstep);
            r0 += R;
        }
}

/* The int8 and int4 calls that codes_tile_rows serves (AVX2) rather than decode_tile's buffer:
 * int8 (per channel or in groups) at 4-8 rows, int4 at 4 and 5; from RB + 1 rows, where the
 * buffer took over from the 3-row blocks. Each weight is decoded once a block of up to HB rows,
 * and the buffer's stores and loads go. Measured on a 2-core AMD EPYC Zen 3 (family 25 model 1),
 * 2026-12-08: the engine generating 96 greedy tokens a request, in-process A/B alternating,
 * medians of 6-10 a side, the same tokens: int8 per channel at batch 4 / 6 / 8 1.27-1.40x /
 * 1.09-1.17x / 1.11-1.14x tokens/s; int4 at batch 4 / 5 1.16x, 0.96x, 1.24x / 1.10x, 1.02x, 1.11x,
 * at 3, 6 and 8 0.96x / 0.98x / 0.96x (so not there). SmolLM2's 120 projections from C,
 * alternating, medians of 9: int8 in groups of 64 at 4-8 rows 0.74-0.91x the time, 9 rows 0.94x;
 * int4 in groups of 32 at 4 / 5 / 6 / 8 rows 0.79x / 0.86x / 0.94x / 1.09x. Per-channel int8 at 3
 * rows in halves (one chain a row, the codes' sum times the scale, as the 3-row blocks sum
 * it) measured 0.94x tokens/s: the blocks keep it. `halves_on` (fleet_codes_halves) turns the
 * path off for A/B runs and the tests: the same bits either way. */
static int halves_on = 1;

int fleet_codes_halves(int on) {
    if (on >= 0) halves_on = on != 0;
    return halves_on;
}

static int codes_halves(int fmt, int64_t M) {
    if (!halves_on) return 0;
    if (fmt == FMT_INT8) return M > RB && M <= 8;
    return fmt == FMT_INT4 && M > RB && M <= 5;
}

/* All M rows of x against one f32 tile w [K][TILE], its first `cols` channels, in blocks of
 * near-equal size (linear.h's pass_rows; not measured apart from the loads and the prefetch,
 * above, with which it came). `next`: the next_bytes that the passes prefetch into L2, a share each
 * spread over its k (the thread's next packed tile, decoded or copied into the buffer after
 * this one), else NULL. */
static void f32_tile_rows(const float *x, int64_t M, int64_t K, const float *w, const float *bias, float *out,
                          int64_t ldo, int cols, const char *next, int64_t next_bytes) {
    const int64_t blocks = (M + HB - 1) / HB, passes = (cols > 16 ? 2 : 1) * blocks;
    const int64_t share = pass_share(next_bytes, passes), pfstep = pf_step(share, K);
    for (int h = 0, p = 0; h < 2 && 16 * h < cols; h++)
        for (int64_t b = 0, r0 = 0; b < blocks; b++, p++) {
            const int R = pass_rows(M, r0, blocks, b);
            halves[R](x + r0 * K, K, w + 16 * h, K, bias ? bias + 16 * h : NULL, out + r0 * ldo + 16 * h, ldo,
                      cols - 16 * h, next ? next + p * share : NULL, pfstep);
            r0 += R;
        }
}
#endif

#if defined(FLEET_AVX512)
/* f32 calls of more than RB rows: every row is one chain of fused multiply-adds in k order
 * from zero, whatever the call (so a row's result does not depend on its batch from RB + 1
 * rows on, nor from 2: a block of 2-8 rows keeps one chain a row too, linear.h's SETS). A tile's rows go in
 * ceil(M / WB) passes of near-equal size, R <= WB rows each: R x 32 accumulators (24 of
 * the 32 zmm registers at 12 rows), each weight vector loaded once a pass. A single pass
 * (9-12 rows) reads the tile from memory once at 24 multiply-adds per 128 bytes, where blocks
 * of 8 and 4 rows read it twice. In-process A/B on a 2-core AMD EPYC Zen 4 (family 25 model
 * 17), SmolLM2's 120 projections back to back as in a decode step, alternating, medians of
 * 11: 12 rows 0.70x the time of the blocks of 8 and 4 (19.5 -> 13.7 ms), 9 rows 0.82x, 48
 * rows 0.92x.
 *
 * Prefetch, up to CONTIGUOUS_ROWS rows (a thread's tiles follow one another then: tile_chunk),
 * into L2: a single pass runs WIDE_AHEAD bytes ahead of its own stream; with P passes, pass p
 * fetches the p-th P-th of the NEXT tile, spread over its k, so that the memory streams
 * through every pass of a tile, the later ones computing from L2, rather than only through
 * the first. In-process A/B on a 2-core Intel Xeon (family 6 model 207), the 120 projections
 * as above with the fused gate/up (which prefetches the same way for its two tiles),
 * alternating, medians of 9, against prefetching in the first pass only (and none in the
 * fused gate/up): 0.81x the time at 9 rows, 0.86x at 12 and 13, 0.81x at 16, 0.88x at 24,
 * 0.74x at 32, 0.88x at 48 (9 of 9 pairs faster but at 48 rows: 7). Into L1, or two tiles
 * ahead: no better. */
#define WB 12
#define WIDE_AHEAD 16384
/* On AMD (wide_prefetch_all off) the passes prefetch the next tile only up to this many rows:
 * past it their multiply-adds outlast the hardware prefetchers' stream of the next tile, and
 * the software prefetch only costs. In-engine A/B on a 2-core AMD EPYC Zen 4 (family 25 model
 * 17), decode steps alternating with and without it, medians of 40 steps a side, three runs: a
 * step at 34 rows 0.963x / 0.966x / 0.985x the time without it, 48 rows 0.972x / 0.962x /
 * 0.971x, 24 rows 1.004x / 0.984x, 12 rows 1.02x / 1.15x (so kept there). */
#define WIDE_PF_ROWS 24

/* Whether an f32 call of M rows prefetches in its passes (f32_tile_wide's pf). */
static int wide_prefetch(int64_t M) {
    return M <= CONTIGUOUS_ROWS && (M <= WIDE_PF_ROWS || wide_prefetch_all());
}

AI void wide_rows(const int R, const float *x, int64_t ldx, const float *w, int64_t K, const float *bias,
                  float *out, int64_t ldo, int cols, const int pf, const char *pfa, int64_t pfstep) {
    vf acc[WB][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = vf_zero();
    for (int64_t k = 0; k < K; k++) {
        if (pf)
            for (int64_t o = 0; o < pfstep; o += 64) _mm_prefetch(pfa + k * pfstep + o, _MM_HINT_T1);
        vf w0 = vf_load(w + k * TILE), w1 = vf_load(w + k * TILE + 16);
        VF_IN_REG(w0);
        VF_IN_REG(w1);
        for (int r = 0; r < R; r++) {
            const vf xb = vf_set1(x[r * ldx + k]);
            acc[r][0] = vf_fmadd(xb, w0, acc[r][0]);
            acc[r][1] = vf_fmadd(xb, w1, acc[r][1]);
        }
    }
    const vm m0 = vm_first(cols), m1 = vm_first(cols - 16);
    const vf b0 = bias ? vf_load_mask(bias, m0) : vf_zero(), b1 = bias ? vf_load_mask(bias + 16, m1) : vf_zero();
    for (int r = 0; r < R; r++) {
        vf_store_mask(out + r * ldo, m0, vf_add(acc[r][0], b0));
        vf_store_mask(out + r * ldo + 16, m1, vf_add(acc[r][1], b1));
    }
}
typedef void (*wide_fn)(const float *, int64_t, const float *, int64_t, const float *, float *, int64_t, int,
                        const char *, int64_t);
#define WIDE(R)                                                                                         \
    static void wide_##R(const float *x, int64_t ldx, const float *w, int64_t K, const float *bias,     \
                         float *out, int64_t ldo, int cols, const char *pfa, int64_t pfstep) {          \
        if (pfa) wide_rows(R, x, ldx, w, K, bias, out, ldo, cols, 1, pfa, pfstep);                      \
        else wide_rows(R, x, ldx, w, K, bias, out, ldo, cols, 0, NULL, 0);                              \
    }
WIDE(5) WIDE(6) WIDE(7) WIDE(8) WIDE(9) WIDE(10) WIDE(11) WIDE(12)
/* A pass has at least 5 rows: more than RB rows split into passes of at most WB. */
static const wide_fn wides[WB + 1] = {NULL, NULL, NULL, NULL, NULL, wide_5, wide_6,
                                      wide_7, wide_8, wide_9, wide_10, wide_11, wide_12};

/* The M (> RB) rows of x against the [K][TILE] float32 tile w (its first `cols` channels) into
 * out [M][ldo] (the tile's first column; bias: the tile's first channel, or NULL), in passes
 * of at most WB rows. Prefetch into L2 (see above): `ahead`, where a single pass runs ahead
 * of its own stream (w + WIDE_AHEAD for a tile read in place), else NULL; `next`, the
 * next_bytes the passes fetch a share each of (the thread's next tile), else NULL. */
static void tile_wide(const float *x, int64_t M, int64_t K, const float *w, int cols, const float *bias,
                      float *out, int64_t ldo, const char *ahead, const char *next, int64_t next_bytes) {
    const int64_t passes = (M + WB - 1) / WB;
    const int64_t share = pass_share(next_bytes, passes);   /* of the next tile, each pass */
    for (int64_t p = 0, r0 = 0; p < passes; p++) {
        const int R = pass_rows(M, r0, passes, p);
        const char *pfa = NULL;
        int64_t pfstep = 0;   /* bytes a k */
        if (ahead && passes == 1) pfa = ahead, pfstep = 2 * 64;
        else if (next) pfa = next + p * share, pfstep = pf_step(share, K);
        wides[R](x + r0 * K, K, w, K, bias, out + r0 * ldo, ldo, cols, pfa, pfstep);
        r0 += R;
    }
}

/* f32 tile i of data, read in place; pf: prefetch (a thread's tiles follow one another). */
static void f32_tile_wide(const float *x, int64_t M, int64_t K, const void *data, int64_t i, int cols,
                          const float *bias, float *out, int64_t ldo, int pf) {
    const float *w = (const float *)data + i * K * TILE;
    const int64_t bytes = K * TILE * (int64_t)sizeof(float);
    tile_wide(x, M, K, w, cols, bias, out, ldo, pf ? (const char *)w + WIDE_AHEAD : NULL,
              pf ? (const char *)w + bytes : NULL, bytes);
}
#endif

#if defined(FLEET_AVX512)
/* Prefill-sized f32 calls (more than CONTIGUOUS_ROWS rows): two tiles (64 channels) at a
 * time in blocks of PB rows, PB x 4 accumulators (24 of the 32 zmm registers), each k's x
 * value broadcast once for four multiply-adds and each weight vector used PB times: 0.42
 * loads a multiply-add, where a block of RB rows of one tile takes 0.63. Each output is one
 * chain of fused multiply-adds in k order from zero, as in a block of RB rows. */
#define PB 6
AI void pair_rows(const int R, const float *x, int64_t ldx, const float *wa, const float *wb, int64_t K,
                  const float *bias_a, const float *bias_b, float *out, int64_t ldo) {
    vf acc[PB][4];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = vf_zero();
    for (int64_t k = 0; k < K; k++) {
        const vf w0 = vf_load(wa + k * TILE), w1 = vf_load(wa + k * TILE + 16);
        const vf w2 = vf_load(wb + k * TILE), w3 = vf_load(wb + k * TILE + 16);
        for (int r = 0; r < R; r++) {
            const vf xb = vf_set1(x[r * ldx + k]);
            acc[r][0] = vf_fmadd(xb, w0, acc[r][0]);
            acc[r][1] = vf_fmadd(xb, w1, acc[r][1]);
            acc[r][2] = vf_fmadd(xb, w2, acc[r][2]);
            acc[r][3] = vf_fmadd(xb, w3, acc[r][3]);
        }
    }
    for (int j = 0; j < 4; j++) {
        const float *bias = j < 2 ? bias_a : bias_b;
        const vf b = bias ? vf_load(bias + 16 * (j & 1)) : vf_zero();
        for (int r = 0; r < R; r++) vf_store(out + r * ldo + 16 * j, vf_add(acc[r][j], b));
    }
}
typedef void (*pair_fn)(const float *, int64_t, const float *, const float *, int64_t, const float *,
                        const float *, float *, int64_t);
#define PAIR(R)                                                                                          \
    static void pair_##R(const float *x, int64_t ldx, const float *wa, const float *wb, int64_t K,      \
                         const float *bias_a, const float *bias_b, float *out, int64_t ldo) {            \
        pair_rows(R, x, ldx, wa, wb, K, bias_a, bias_b, out, ldo);                                      \
    }
PAIR(1) PAIR(2) PAIR(3) PAIR(4) PAIR(5) PAIR(6)
static const pair_fn pairs[PB + 1] = {NULL, pair_1, pair_2, pair_3, pair_4, pair_5, pair_6};

/* fleet_linear for f32 past CONTIGUOUS_ROWS rows: the whole tiles two at a time, their rows
 * in blocks of PB, the rest of the tiles as the main loop does. The same bits as the main
 * loop: one chain a row (f32_tile_wide). In-process A/B on a 2-core Intel Xeon with
 * AMX (SmolLM2's shapes, 1,024 rows, alternating, medians of 40): qkv 0.91x the time, gate_up
 * 0.85x, o_proj 0.98x, down level; the throughput workload 1.05x tokens/s (ABBA, 4 runs each).
 *
 * A work unit is one pair (or left-over tile) over one chunk of the rows, with the fewest
 * chunks that give every thread as many units: a 576-channel weight has 9 pairs, which two
 * threads took 5 and 4, so one waited a ninth of the call; in two chunks of rows they take 9
 * units each. A row's result does not depend on its chunk (one chain a row). A chunk has at
 * least CHUNK_ROWS rows: each reads its pairs' weights again. C harness on a 2-core Intel Xeon
 * (family 6 model 167), two builds alternating, medians of 11-21: at 1,022 rows o_proj 0.95x
 * and 0.96x the time, down (9 pairs each) 0.91x and 0.94x, qkv (15 pairs) 0.95x and 0.96x; at
 * 128 rows 0.95-0.99x; at 64 rows, chunks of 32, 1.02-1.13x, hence the floor. */
#define CHUNK_ROWS 64
static void f32_pairs(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                      float *out, int num_threads) {
    const int64_t whole = N / TILE, tiles = (N + TILE - 1) / TILE, pairs_n = whole / 2;
    const int64_t per = pairs_n + tiles - 2 * pairs_n;   /* units a chunk of rows */
    int64_t chunks = 1;
    while ((chunks * per) % num_threads && chunks < num_threads && M / (chunks + 1) >= CHUNK_ROWS) chunks++;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t unit = 0; unit < chunks * per; unit++) {
        const int64_t u = unit % per, c = unit / per, r_lo = M * c / chunks, m = M * (c + 1) / chunks - r_lo;
        const float *xc = x + r_lo * K;
        float *oc = out + r_lo * N;
        if (u >= pairs_n) {   /* a tile left over: an odd one, or a last partial one */
            const int64_t t = 2 * pairs_n + (u - pairs_n);
            const int cols = tile_cols(N, t);
            f32_tile_wide(xc, m, K, data, t, cols, bias ? bias + t * TILE : NULL, oc + t * TILE, N, 0);
            continue;
        }
        const int64_t i = 2 * u;
        const float *wa = (const float *)data + i * K * TILE, *wb = wa + K * TILE;
        for (int64_t r0 = 0; r0 < m; r0 += PB) {
            const int R = m - r0 < PB ? (int)(m - r0) : PB;
            pairs[R](xc + r0 * K, K, wa, wb, K, bias ? bias + i * TILE : NULL, bias ? bias + (i + 1) * TILE : NULL,
                     oc + r0 * N + i * TILE, N);
        }
    }
}
#endif

/* A tile decoded into buf [K][TILE] float32 (the fp32 tile layout). */
static void decode_tile(int fmt, const tile_t *t, float *buf) {
    vf w[4], s[2] = {vf_zero(), vf_zero()}, m[2] = {s[0], s[1]};
    const int64_t K = t->k, G = fmt == FMT_INT8 || fmt == FMT_INT4 ? t->group : t->k;
    const int step = fmt == FMT_INT4 ? 2 : 1;
    if (fmt == FMT_F32) {
        memcpy(buf, t->data, sizeof(float) * (size_t)(K * TILE));
        return;
    }
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        group_scales(fmt, t, g, s, m);
        for (int64_t k = k0; k < k0 + G; k += step) {
            switch (fmt) {   /* constant formats, so that each case inlines its own decode */
            case FMT_BF16: decode(FMT_BF16, 0, t, k, s, m, w); break;
            case FMT_INT8: decode(FMT_INT8, 0, t, k, s, m, w); break;
            default: decode(FMT_INT4, 0, t, k, s, m, w);
            }
            for (int j = 0; j < 2 * step; j++) vf_store(buf + k * TILE + 16 * j, w[j]);
        }
    }
}

/* Tiles a thread takes at a time. Where the row blocks prefetch the next tile (pf_plan), each
 * thread's tiles must follow one another: one contiguous share each, as a static schedule
 * gives. Past CONTIGUOUS_ROWS (48) nothing is prefetched and the tiles go
 * one at a time, so that a thread the machine slows down takes fewer: the threads of a
 * static split waited for each other at every call's end (libgomp's barrier was 10 % of a
 * prefill step's samples, perf, 2-core AMD EPYC Zen 5). In-process A/B, 1,020-token prefill
 * steps: 0.95x the time (median of 10 alternating pairs, 9 of them faster); results are the
 * same bits, each tile being computed as before. */
static int64_t tile_chunk(int64_t tiles, int64_t M, int threads) {
    if (M > CONTIGUOUS_ROWS || threads < 2) return 1;
    return (tiles + threads - 1) / threads;
}

/* [M][K / G] sums of each row of x over each group of G (for accumulate_int4_folded). */
static float *group_sums(const float *x, int64_t M, int64_t K, int64_t G) {
    float *sums = malloc((size_t)(M * (K / G) + 1) * sizeof(float));
    if (!sums) return NULL;
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < K / G; g++) {
            float acc = 0.f;
            for (int64_t k = g * G; k < (g + 1) * G; k++) acc += x[r * K + k];
            sums[r * (K / G) + g] = acc;
        }
    return sums;
}

#if defined(FLEET_AVX512)
#define WIDE_PATH(fmt, M) ((fmt) == FMT_F32 && (M) > RB)
#else
#define WIDE_PATH(fmt, M) 0
#endif

int fleet_linear_supported(int fmt) { return fmt >= 0 && fmt < FMT_COUNT; }

int fleet_linear(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                 const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    if (fmt == FMT_INT4Q) {   /* every call over int4 quads (linear_digits.c); 2: not quads here */
        if (K < 1 || G < 1 || K % G) return 2;
        const int rc = fleet_linear_quads(x, M, N, K, G, data, scales, mins, bias, out, num_threads);
        return rc == 1 ? 2 : rc;
    }
    if (!fleet_linear_supported(fmt) || K < 1 || N < 1 || M < 0) return 1;
    if (fmt >= FMT_INT8 && (G < 1 || K % G || (fmt == FMT_INT4 && G % 8))) return 2;
    if (fmt == FMT_BF16 && M >= AMX_ROWS && !fleet_linear_amx(x, M, N, K, data, bias, out, num_threads)) return 0;
    if ((fmt == FMT_INT8 || fmt == FMT_INT4) && M >= (fmt == FMT_INT4 ? AMX_SPLIT_ROWS_INT4 : AMX_SPLIT_ROWS)
        && !fleet_linear_amx_split(fmt, x, M, N, K, G, data, scales, mins, bias, out, num_threads)) return 0;
    const int digit_rows = fleet_digit_tuning(-1);   /* 0 where that path does not run */
    if (digit_rows && M >= digit_rows && fleet_digits_take(fmt, K, G)
        && !fleet_linear_digits(fmt, x, M, N, K, G, data, scales, mins, bias, out, num_threads)) return 0;
#if defined(FLEET_AVX512)
    if (fmt == FMT_F32 && M > CONTIGUOUS_ROWS && N >= 2 * TILE && f32_pairs_on()) {
        f32_pairs(x, M, N, K, data, bias, out, num_threads);
        return 0;
    }
#endif
    const int64_t tiles = (N + TILE - 1) / TILE;
    const int64_t bytes = tile_bytes(fmt, K);   /* of one packed tile, for the prefetch */
#if defined(FLEET_AVX2)
    /* f32 goes through the buffer past HALF_ROWS rows, for f32_tile_rows. */
    const int in_regs = codes_halves(fmt, M);
    const int direct = M <= RB || (fmt == FMT_F32 && M <= HALF_ROWS) || in_regs;
#else
    const int direct = fmt == FMT_F32 || M <= RB;
#endif
    float *xsum = fmt == FMT_INT4 && M <= RB ? group_sums(x, M, K, G) : NULL;
    if (fmt == FMT_INT4 && M <= RB && !xsum) return 3;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads) if (tiles > 1 && M * N * K >= 65536)
    {
        float *buf = direct ? NULL : aligned_alloc(64, (size_t)K * TILE * sizeof(float));
        if (!direct && !buf) failed = 3;
        const int64_t chunk = tile_chunk(tiles, M, omp_get_num_threads());
        #pragma omp for schedule(dynamic, chunk)
        for (int64_t i = 0; i < tiles; i++) {
            if (!direct && !buf) continue;
            tile_t t = tile_at(fmt, data, scales, mins, K, G, i);
            const char *own = t.data;
            int f = fmt;
            if (!direct) {
                decode_tile(fmt, &t, buf);
                t = (tile_t){buf, NULL, NULL, K, 0, NULL, {NULL, 0}};
                f = FMT_F32;
            }
            const int cols = tile_cols(N, i);
#if defined(FLEET_AVX512)
            if (WIDE_PATH(fmt, M)) {
                f32_tile_wide(x, M, K, data, i, cols, bias ? bias + i * TILE : NULL, out + i * TILE, N,
                              wide_prefetch(M));
                continue;
            }
            if (!direct) {   /* the decoded tile, from the buffer; the passes fetch the next packed tile */
                tile_wide(x, M, K, t.data, cols, bias ? bias + i * TILE : NULL, out + i * TILE, N, NULL,
                          M <= CONTIGUOUS_ROWS ? own + bytes : NULL, bytes);
                continue;
            }
#endif
#if defined(FLEET_AVX2)
            if (in_regs) {   /* decoded in registers, half a tile at a time */
                codes_tile_rows(fmt, x, M, &t, bias ? bias + i * TILE : NULL, out + i * TILE, N, cols,
                                M <= CONTIGUOUS_ROWS ? own + bytes : NULL, bytes);
                continue;
            }
            if (!direct) {   /* the tile is in the buffer */
                f32_tile_rows(x, M, K, t.data, bias ? bias + i * TILE : NULL, out + i * TILE, N, cols,
                              M <= CONTIGUOUS_ROWS ? own + bytes : NULL, bytes);
                continue;
            }
#endif
            for (int64_t r0 = 0; r0 < M; r0 += RB) {
                const int R = M - r0 < RB ? (int)(M - r0) : RB;
                t.xsum = xsum ? xsum + r0 * (K / G) : NULL;
                t.pf = pf_plan(own, bytes, K, M, r0 / RB);
                blocks[f][R](x + r0 * K, K, &t, bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N, cols);
            }
        }
        free(buf);
    }
    free(xsum);
    return failed;
}

#if defined(FLEET_AVX512)
/* out[r][0..TILE) = silu(g[r]) * u[r] for R rows of one tile's gate and up results (row
 * strides ld and ldo), as glue.c's silu_mul computes each element. */
AI void silu_mul_rows(int64_t R, const float *g, const float *u, int64_t ld, float *out, int64_t ldo) {
    for (int64_t r = 0; r < R; r++)
        for (int c = 0; c < TILE; c += 16)
            vf_store(out + r * ldo + c, vf_silu_mul(vf_load(g + r * ld + c), vf_load(u + r * ld + c)));
}

/* fleet_linear_silu_mul where fleet_linear takes f32_pairs: gate tile j and up tile j + items
 * as the pair, PB rows at a time into a [PB][2 TILE] block on the stack (gate channels, then
 * up), and the activation from there into out [M][items TILE]. The same bits as f32_pairs
 * then glue.c's silu_mul. In-process A/B on a 2-core Intel Xeon (family 6 model 207, no AMX
 * exposed), SmolLM2's gate/up [3072 x 576], alternating, medians of 11: against f32_pairs then
 * silu_mul 0.93x the time at 64 rows, 0.92x at 256, 0.95x at 1,024, where the single-tile
 * passes below took 1.00x, 0.94x and 1.09x. */
static void f32_pairs_silu_mul(const float *x, int64_t M, int64_t K, const void *data, const float *bias,
                               float *out, int64_t items, int num_threads) {
    const int64_t half = items * TILE;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (items > 1)
    for (int64_t j = 0; j < items; j++) {
        float y[PB][2 * TILE] __attribute__((aligned(64)));
        const float *wa = (const float *)data + j * K * TILE, *wb = (const float *)data + (items + j) * K * TILE;
        for (int64_t r0 = 0; r0 < M; r0 += PB) {
            const int R = M - r0 < PB ? (int)(M - r0) : PB;
            pairs[R](x + r0 * K, K, wa, wb, K, bias ? bias + j * TILE : NULL, bias ? bias + half + j * TILE : NULL,
                     &y[0][0], 2 * TILE);
            silu_mul_rows(R, &y[0][0], &y[0][TILE], 2 * TILE, out + r0 * half + j * TILE, half);
        }
    }
}
#endif

/* out [M][N / 2] = silu(y[:, :N / 2]) * y[:, N / 2:], y = x W^T (+ b): a gate/up projection and
 * the activation after it in one call (f32 weights, more than RB rows, N / 2 a multiple of
 * TILE, AVX-512; else returns 1 and writes nothing: the caller takes fleet_linear and
 * fleet_silu_mul_f32). A work item is gate tile j and up tile j + N / (2 TILE): both into a
 * thread's [M][TILE] scratch pair by f32_tile_wide, as fleet_linear computes them (the same
 * bits), then vf_silu_mul as glue.c applies it, straight into out. So the [M][N] product
 * never goes through memory and back. */
int fleet_linear_silu_mul(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                          float *out, int num_threads) {
#if defined(FLEET_AVX512)
    const int64_t half = N / 2, items = half / TILE;
    if (M <= RB || K < 1 || N % 2 || half % TILE || items < 1) return 1;
    if (M > CONTIGUOUS_ROWS && f32_pairs_on()) {
        f32_pairs_silu_mul(x, M, K, data, bias, out, items, num_threads);
        return 0;
    }
    int failed = 0;
    #pragma omp parallel num_threads(num_threads) if (items > 1)
    {
        float *g = aligned_alloc(64, (size_t)M * 2 * TILE * sizeof(float)), *u = g ? g + M * TILE : NULL;
        if (!g) failed = 3;
        const int64_t chunk = tile_chunk(items, M, omp_get_num_threads());
        const int pf = wide_prefetch(M);
        #pragma omp for schedule(dynamic, chunk)
        for (int64_t j = 0; j < items; j++) {
            if (!g) continue;
            f32_tile_wide(x, M, K, data, j, TILE, bias ? bias + j * TILE : NULL, g, TILE, pf);
            f32_tile_wide(x, M, K, data, items + j, TILE, bias ? bias + half + j * TILE : NULL, u, TILE, pf);
            silu_mul_rows(M, g, u, TILE, out + j * TILE, half);
        }
        free(g);
    }
    return failed;
#else
    (void)x; (void)M; (void)N; (void)K; (void)data; (void)bias; (void)out; (void)num_threads;
    return 1;
#endif
}

#else   /* no AVX-512 or AVX2: the callers keep their torch path */

int fleet_linear_supported(int fmt) { (void)fmt; return 0; }

int fleet_linear_tuning(int far, int pairs, int wide, int one) {
    (void)far; (void)pairs; (void)wide; (void)one;
    return 0;
}

int fleet_linear(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                 const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)fmt; (void)x; (void)M; (void)N; (void)K; (void)G; (void)data; (void)scales; (void)mins;
    (void)bias; (void)out; (void)num_threads;
    return 1;
}

int fleet_linear_silu_mul(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                          float *out, int num_threads) {
    (void)x; (void)M; (void)N; (void)K; (void)data; (void)bias; (void)out; (void)num_threads;
    return 1;
}
#endif

#if !defined(FLEET_AVX2)
/* Only AVX2 builds run int8 and int4 tiles in halves decoded in registers (codes_tile_rows). */
int fleet_codes_halves(int on) {
    (void)on;
    return 0;
}
#endif

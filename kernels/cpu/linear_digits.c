/* Weight-only int8 (per output channel) and int4 (groups of 32 or more) calls on CPUs with
 * AVX512_VNNI and no AMX: x carried as two bytes a value, the products as integer dot
 * products (vpdpbusd).
 *
 * Past a few rows such a call is bound by the multiply-adds, not by the weights' stream: its
 * codes decoded to float32 run as many FMAs as fp32 does, plus the decode, so it cannot be
 * faster than fp32 there (a 2-core AMD EPYC Zen 4: int8 1.05-1.16x fp32's time at 32-64 rows).
 * vpdpbusd does 64 byte products a zmm instruction, an FMA 16; with x in two bytes a product
 * takes two, so 32 products an instruction, twice an FMA's. At one row the float path is bound
 * by its decode instead (int4: a byte of codes a nibble lookup, two conversions and two FMAs
 * for 32 weights), which the integer products need none of.
 *
 * x row r, group g of XG (64) input features (32 for int4 in groups of 32, so that each x group
 * lies inside one weight group): xs[r][g] = max|x| / 32767 over the group,
 * X = round(x / xs) in [-32767, 32767] (nearest even), as two bytes X = 256 hi + lo (hi the
 * signed high byte, lo the unsigned low one). A row group whose values are not all finite gets
 * xs = NaN (the row's outputs become NaN, as a float matmul gives). For channel n with codes q
 * over group g, S_g = sum_k X q = 256 sum hi q + sum lo q, exact in int32:
 *   int8 (codes signed, so x is vpdpbusd's unsigned operand: U = X + 32768 = 256 (hi + 128) + lo):
 *   S_g = 256 sum (hi + 128) q + sum lo q - 32768 sum q (|256 sum (hi + 128) q| <= 256 * 255 *
 *   127 * 64 < 2^31); y[r][n] = scale[n] * (sum over g, in g order, of S_g * xs[r][g] as fused
 *   multiply-adds) (+ b[n]).
 *   int4 (codes 0-15 fit either operand: vpdpbusd(codes, hi) and vpdpbusd(lo, codes), no
 *   offset; w = q * scale + min a weight group, x group g inside weight group G(g)): over g in
 *   order, y += S_g * (xs * scale[G(g)][n]), then y += min[G(g)][n] * (xs * sum_{k in g} X).
 * So x is rounded to 16 bits relative to its group's largest value, about what the AMX path's
 * two bf16 (hi + lo) keep of each value, and far below the weights' own rounding; the sums of
 * products are exact. A row's result depends on that row alone.
 *
 * int8 calls of fewer than DIGIT_ROWS rows keep linear.c's float path (so, as on AMX CPUs, a
 * row's bits differ between a small and a large call): each thread lays its tile's codes out as
 * vpdpbusd takes them ([K/4][32][4]: four consecutive k of a channel in one 32-bit lane, 18 KiB
 * at K = 576, in L1) with each group's code sums, then runs the rows in blocks of at most DB.
 * The greedy head's int8 screen lays its codes out so once, at load (fleet_int8_lay), and runs
 * every call on them (fleet_linear_int8_laid): at 4 rows the float path's multiply-adds made
 * the head compute-bound (SmolLM2's head on Zen 4: 1.50 -> 0.93 ms; 1 and 2 rows level, 8
 * rows 2.51 -> 1.86).
 * int4 takes this path at every row count, over codes packed in that layout once, at load
 * (linear.py's "int4 quads": fleet_int4_quads says where): 128 bytes a block of 8 k, two
 * 64-byte halves of 16 channels, byte 4 c + i of half h holding k = 8 j + i of channel 16 h + c
 * in its low nibble and k = 8 j + 4 + i in its high one, so a load and two masks give
 * vpdpbusd's operands for both quads of k. */
#include <stdint.h>
#include <stdlib.h>

#include "linear.h"

#define XG 64           /* x's group: one scale per 64 input features */
#define DIGIT_ROWS 9    /* int8 calls from this many rows on take this path (fleet_digit_tuning): RB + 1 */

/* x's group for a call (0: the path does not take it): XG for per-channel int8 and int4 in
 * groups of a multiple of XG, XG / 2 for int4 in other groups of a multiple of 32 (so each x
 * group lies inside one weight group; int4's groups are powers of two, so that is 32); K a
 * multiple of it. int4 in linear.c's k-pair layout (FMT_INT4) keeps the float path. */
static int64_t x_group(int fmt, int64_t K, int64_t G) {
    const int64_t xg = fmt == FMT_INT8 && G == K ? XG : fmt == FMT_INT4Q && G % XG == 0 ? XG
                     : fmt == FMT_INT4Q && G % (XG / 2) == 0 ? XG / 2 : 0;
    return xg && K >= xg && K % xg == 0 ? xg : 0;
}

/* The calls this path takes (where it runs): per-channel int8 (K a multiple of 64), and int4
 * quads (groups of a multiple of 32); returns x's group for them (x_group), 0 for the others. */
int fleet_digits_take(int fmt, int64_t K, int64_t G) {
    return (int)x_group(fmt, K, G);
}

#if defined(FLEET_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
#include <math.h>
#include <omp.h>
#include "tile_decode.h"
/* Calls over int4 quads that split nibbles in registers (fleet_quads_split) prefetch their own
 * stream quads_prefetch bytes ahead into L1 (fleet_quads_prefetch; 0: not at all). Intel: 4 KiB
 * (a 2-core Xeon, family 6 model 207, no AMX exposed, SmolLM2's 210 projections
 * in one C loop, the library before quads (k pairs, float path) and after, interleaved, medians
 * of 21: new/old 0.85 / 0.90 / 0.90 at 1 / 2 / 4 rows without it, 0.60 / 0.62 / 0.78 with 4 KiB;
 * 2 KiB: 0.64 / 0.60 / 0.72, 8 KiB: 0.66 / 0.62 / 0.77). AMD: 2 KiB (EPYC Zen 4, family 25
 * model 17, 2 cores, 30 layers' projections from Python, interleaved, medians of 15 and 25:
 * against none 0.87 / 0.83 / 0.85 / 0.80 and 0.86 / 0.84 / 0.85 / 0.86 at 1 / 2 / 4 / 6 rows;
 * 1 KiB 0.94 / 0.84 / 0.86 / 0.89, 3 KiB 0.85 / 0.81 / 0.85 / 0.87, 4 KiB 0.89-0.93 / 0.82-0.87 /
 * 0.84-0.85 / 0.87-0.88, 8 KiB 0.88 / 0.88 / 0.87 / 0.88, 16 KiB 0.88 / 0.89 / 0.90 / 0.90). */
#define PF_QUADS_INTEL 4096
#define PF_QUADS_AMD 2048
#define DB 6            /* rows a block: 24 accumulators (12 int32 of a group, 12 float totals) */

/* Row r of x [M][K] as the two digit planes hi, lo [M][K] (hi as U's high byte, U = X + 32768,
 * or with signed_hi as X's own signed high byte: the same byte with its top bit flipped), scales
 * xs [M][K / xg] and xsum = xs * sum X over each group of xg (XG or XG / 2) features (what
 * int4's mins multiply). */
static void x_digits(const float *x, int64_t r, int64_t K, int64_t xg, int signed_hi, uint8_t *hi, uint8_t *lo,
                     float *xs, float *xsum) {
    const __m512i lim = _mm512_set1_epi32(32767), neg = _mm512_set1_epi32(-32767);
    const __m512i off = _mm512_set1_epi32(32768), low = _mm512_set1_epi32(255);
    const __m512i flip = _mm512_set1_epi32(signed_hi ? 0x80 : 0);
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
            const __m512i h = _mm512_xor_si512(_mm512_srli_epi32(q, 8), flip);
            _mm_storeu_si128((__m128i *)(hi + r * K + g * xg + k), _mm512_cvtepi32_epi8(h));
            _mm_storeu_si128((__m128i *)(lo + r * K + g * xg + k), _mm512_cvtepi32_epi8(_mm512_and_si512(q, low)));
        }
        xs[r * (K / xg) + g] = scale;
        xsum[r * (K / xg) + g] = scale * (float)sum;   /* |sum| <= 64 * 32767: exact in float */
    }
}

/* Room for a call's x as digit planes, scales and group sums (x_digits fills it), in one
 * allocation; NULL when it fails. */
typedef struct {
    uint8_t *hi, *lo;
    float *xs, *xsum;
} planes_t;

static void *x_planes(int64_t M, int64_t K, int64_t xg, planes_t *p) {
    const int64_t groups = K / xg;
    char *mem = malloc((size_t)(2 * M * K) + (size_t)(2 * M * groups) * sizeof(float));
    if (!mem) return NULL;
    p->xs = (float *)mem;
    p->xsum = p->xs + M * groups;
    p->hi = (uint8_t *)(p->xsum + M * groups);
    p->lo = p->hi + M * K;
    return mem;
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

/* A per-channel int8 tile ([K][32]) as vpdpbusd's [K/4][32][4] codes in w, and comp [K / XG][32]:
 * 32768 x each x group's sum of a channel's codes (what the +32768 of U adds). */
static void tile_layout(const int8_t *t, int64_t K, int8_t *w, int32_t *comp) {
    for (int64_t k = 0; k < K; k += 4)
        quad_store(_mm256_loadu_si256((const __m256i *)(t + k * TILE)),
                   _mm256_loadu_si256((const __m256i *)(t + (k + 1) * TILE)),
                   _mm256_loadu_si256((const __m256i *)(t + (k + 2) * TILE)),
                   _mm256_loadu_si256((const __m256i *)(t + (k + 3) * TILE)), w + k * TILE);
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

/* R rows of x's planes (row stride K) against one laid-out int8 tile (w, comp, scales). */
AI void int8_rows(const int R, const planes_t *x, int64_t K, const int8_t *w, const int32_t *comp,
                  const float *scales, const float *bias, float *out, int64_t ldo, int cols) {
    const int64_t groups = K / XG;
    vf y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = vf_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[RB][2];   /* R <= DB of them */
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        dot_span(R, x->hi, K, w, g * XG, g * XG + XG, acc, (pf_t){NULL, 0, 0}, 0);
        for (int r = 0; r < R; r++) acc[r][0] = _mm512_slli_epi32(acc[r][0], 8), acc[r][1] = _mm512_slli_epi32(acc[r][1], 8);
        dot_span(R, x->lo, K, w, g * XG, g * XG + XG, acc, (pf_t){NULL, 0, 0}, 0);
        fold_group(R, acc, comp + g * TILE, x->xs + g, groups, y);
    }
    scale_rows(R, y, scales);
    store_rows(R, y, bias, out, ldo, cols);
}

/* int4 quads: block j's two halves (in the packed layout, or split into low and high nibbles
 * beforehand) as a[h] (k = 8 j .. 8 j + 3) and c[h] (8 j + 4 .. 8 j + 7). */
AI void quad_codes(const uint8_t *packed, const uint8_t *split, int64_t j, __m512i a[2], __m512i c[2]) {
    if (split) {
        for (int h = 0; h < 2; h++) {
            a[h] = _mm512_load_si512(split + j * 256 + 64 * h);
            c[h] = _mm512_load_si512(split + j * 256 + 128 + 64 * h);
        }
        return;
    }
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_loadu_si512(packed + j * 128 + 64 * h);
        a[h] = _mm512_and_si512(v, nib);
        c[h] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    }
}

/* The high (hi signed, vpdpbusd's second operand) or the low bytes' (lo unsigned, its first)
 * products of R rows with block j's codes into acc[r][h][0] (k = 8 j .. 8 j + 3) and
 * acc[r][h][S - 1] (8 j + 4 .. 8 j + 7). */
AI void quad_dots(const int R, const int S, const int high, const uint8_t *xr, int64_t K, int64_t k,
                  const __m512i a[2], const __m512i c[2], __m512i acc[][2][2]) {
    for (int r = 0; r < R; r++) {
        const __m512i x0 = _mm512_set1_epi32(*(const int32_t *)(xr + r * K + k));
        const __m512i x1 = _mm512_set1_epi32(*(const int32_t *)(xr + r * K + k + 4));
        for (int h = 0; h < 2; h++) {
            acc[r][h][0] = high ? _mm512_dpbusd_epi32(acc[r][h][0], a[h], x0) : _mm512_dpbusd_epi32(acc[r][h][0], x0, a[h]);
            acc[r][h][S - 1] = high ? _mm512_dpbusd_epi32(acc[r][h][S - 1], c[h], x1)
                                    : _mm512_dpbusd_epi32(acc[r][h][S - 1], x1, c[h]);
        }
    }
}

/* R rows of x's planes (hi signed) against one int4 quads tile, per x group: S = 256 sum hi q +
 * sum lo q, then the group's fold (the header's int4 formula). Up to 3 rows, the high and the
 * low bytes' sums in accumulators of their own, in one pass over the group's codes (one row:
 * the two quads of a block in sets of their own too, for more independent chains); from 4
 * rows, in one accumulator a row and half, the high bytes' pass, a shift, then the low bytes'
 * (so that 6 rows' accumulators and totals fit the 32 registers). */
AI void int4_rows(const int R, const planes_t *x, int64_t K, int64_t G, int64_t xg, const uint8_t *packed,
                  const uint8_t *split, const int pf, const uint16_t *scales, const uint16_t *mins, const float *bias, float *out,
                  int64_t ldo, int cols) {
    const int S = R == 1 ? 2 : 1, one_pass = R <= 3;
    const int64_t groups = K / xg;
    vf y[RB][2];
    for (int r = 0; r < R; r++) y[r][0] = y[r][1] = vf_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m512i ah[DB][2][2], al[3][2][2];   /* [row][half][set]; al: one pass only */
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < S; s++) {
                    ah[r][h][s] = _mm512_setzero_si512();
                    if (one_pass) al[r][h][s] = _mm512_setzero_si512();
                }
        for (int64_t k = g * xg; k < g * xg + xg; k += 8) {
            __m512i a[2], c[2];
            if (pf) {
                _mm_prefetch((const char *)packed + k * 16 + pf, _MM_HINT_T0);
                _mm_prefetch((const char *)packed + k * 16 + pf + 64, _MM_HINT_T0);
            }
            quad_codes(packed, split, k / 8, a, c);
            quad_dots(R, S, 1, x->hi, K, k, a, c, ah);
            if (one_pass) quad_dots(R, S, 0, x->lo, K, k, a, c, al);
        }
        if (!one_pass) {
            for (int r = 0; r < R; r++) ah[r][0][0] = _mm512_slli_epi32(ah[r][0][0], 8), ah[r][1][0] = _mm512_slli_epi32(ah[r][1][0], 8);
            for (int64_t k = g * xg; k < g * xg + xg; k += 8) {
                __m512i a[2], c[2];
                quad_codes(packed, split, k / 8, a, c);
                quad_dots(R, S, 0, x->lo, K, k, a, c, ah);
            }
        }
        const int64_t wg = g * xg / G;
        for (int h = 0; h < 2; h++) {
            const vf s = vf_from_f16(scales + wg * TILE + 16 * h), m = vf_from_f16(mins + wg * TILE + 16 * h);
            for (int r = 0; r < R; r++) {
                __m512i sum = ah[r][h][0];
                if (one_pass) {
                    __m512i hs = ah[r][h][0], ls = al[r][h][0];
                    if (S == 2) hs = _mm512_add_epi32(hs, ah[r][h][1]), ls = _mm512_add_epi32(ls, al[r][h][1]);
                    sum = _mm512_add_epi32(_mm512_slli_epi32(hs, 8), ls);
                }
                const vf sx = vf_mul(s, vf_set1(x->xs[r * groups + g]));
                y[r][h] = vf_fmadd(_mm512_cvtepi32_ps(sum), sx, y[r][h]);
                y[r][h] = vf_fmadd(m, vf_set1(x->xsum[r * groups + g]), y[r][h]);
            }
        }
    }
    store_rows(R, y, bias, out, ldo, cols);
}

typedef struct {            /* one block of rows against one tile */
    planes_t x;                 /* the block's planes */
    int64_t K, G, xg;
    const int8_t *w;            /* int8: tile_layout's codes and comp */
    const int32_t *comp;
    const uint8_t *packed, *split;   /* int4: the packed tile, its nibbles split (NULL: split in registers) */
    int pf;                     /* int4: prefetch the packed tile's stream this many bytes ahead (0: not) */
    const void *scales, *mins;  /* the tile's: [1][32] float32 (int8), [K / G][32] fp16 (int4) */
} dblock_t;

typedef void (*digit_fn)(const dblock_t *, const float *, float *, int64_t, int);
#define DIGITS(R)                                                                                            \
    static void int8_##R(const dblock_t *d, const float *bias, float *out, int64_t ldo, int cols) {          \
        int8_rows(R, &d->x, d->K, d->w, d->comp, d->scales, bias, out, ldo, cols);                           \
    }                                                                                                        \
    static void int4_##R(const dblock_t *d, const float *bias, float *out, int64_t ldo, int cols) {          \
        int4_rows(R, &d->x, d->K, d->G, d->xg, d->packed, d->split, d->pf, d->scales, d->mins, bias, out, ldo, cols); \
    }
DIGITS(1) DIGITS(2) DIGITS(3) DIGITS(4) DIGITS(5) DIGITS(6)
static const digit_fn int8_blocks[DB + 1] = {NULL, int8_1, int8_2, int8_3, int8_4, int8_5, int8_6};
static const digit_fn int4_blocks[DB + 1] = {NULL, int4_1, int4_2, int4_3, int4_4, int4_5, int4_6};

/* A tile's rows in blocks of at most DB (near-equal passes), d's planes moved to each block. */
static void run_blocks(const digit_fn *fns, dblock_t d, int64_t M, int64_t N, int64_t i, const float *bias,
                       float *out) {
    const int64_t groups = d.K / d.xg, blocks = (M + DB - 1) / DB;
    const planes_t x = d.x;
    for (int64_t b = 0, r0 = 0; b < blocks; b++) {
        const int R = pass_rows(M, r0, blocks, b);
        d.x = (planes_t){x.hi + r0 * d.K, x.lo + r0 * d.K, x.xs + r0 * groups, x.xsum + r0 * groups};
        fns[R](&d, bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N, tile_cols(N, i));
        r0 += R;
    }
}

int fleet_linear_digits(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                        const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)mins;
    if (fmt != FMT_INT8 || !x_group(fmt, K, G) || M < 1 || N < 1 || fleet_amx_ready()) return 1;
    const int64_t tiles = (N + TILE - 1) / TILE;
    planes_t p;
    void *mem = x_planes(M, K, XG, &p);
    int failed = !mem;
    if (!failed) {
        #pragma omp parallel num_threads(num_threads)
        {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) x_digits(x, r, K, XG, 0, p.hi, p.lo, p.xs, p.xsum);
            int8_t *w = aligned_alloc(64, (size_t)(K * TILE));
            int32_t *comp = aligned_alloc(64, (size_t)(K / XG * TILE) * sizeof(int32_t));
            if (!w || !comp) failed = 1;
            #pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < tiles; i++) {
                if (!w || !comp) continue;
                const tile_t t = tile_at(FMT_INT8, data, scales, NULL, K, G, i);   /* its codes and scales */
                tile_layout(t.data, K, w, comp);
                run_blocks(int8_blocks, (dblock_t){p, K, G, XG, w, comp, NULL, NULL, 0, t.scales, NULL}, M, N, i, bias,
                           out);
            }
            free(w);
            free(comp);
        }
    }
    free(mem);
    return failed ? 3 : 0;
}

/* Per-channel int8 codes (linear.c's tiles [N/32][K][32], K a multiple of XG) laid out once as
 * the calls above lay each tile out per call: w [N/32][K/4][32][4] and comp [N/32][K/XG][32]
 * (tile_layout). Returns 0; 1 where this path does not run here (no VNNI, AMX, or K). */
int fleet_int8_lay(const void *data, int64_t N, int64_t K, int8_t *w, int32_t *comp) {
    if (!x_group(FMT_INT8, K, K) || N < 1 || fleet_amx_ready()) return 1;
    const int64_t tiles = (N + TILE - 1) / TILE;
    for (int64_t i = 0; i < tiles; i++)
        tile_layout((const int8_t *)data + i * K * TILE, K, w + i * K * TILE, comp + i * (K / XG) * TILE);
    return 0;
}

/* y [M][N] = x W^T over fleet_int8_lay's codes and the tiles' per-channel scales [N/32][32]:
 * the products of the calls above (x as two bytes a value, integer sums, the same folds), at
 * every row count and without their per-call layout. Each thread a contiguous share of the
 * tiles (the stream the hardware prefetchers follow). Returns 0; 1 where the path does not run
 * here; 3 where memory ran out. */
int fleet_linear_int8_laid(const float *x, int64_t M, int64_t N, int64_t K, const int8_t *w, const int32_t *comp,
                           const float *scales, float *out, int num_threads) {
    if (!x_group(FMT_INT8, K, K) || M < 0 || N < 1 || fleet_amx_ready()) return 1;
    if (M == 0) return 0;
    const int64_t tiles = (N + TILE - 1) / TILE;
    planes_t p;
    void *mem = x_planes(M, K, XG, &p);
    if (!mem) return 3;
    #pragma omp parallel num_threads(num_threads) if (tiles > 1 && M * N * K >= 65536)
    {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++) x_digits(x, r, K, XG, 0, p.hi, p.lo, p.xs, p.xsum);
        #pragma omp for schedule(dynamic, (tiles + omp_get_num_threads() - 1) / omp_get_num_threads())
        for (int64_t i = 0; i < tiles; i++)
            run_blocks(int8_blocks, (dblock_t){p, K, K, XG, w + i * K * TILE, comp + i * (K / XG) * TILE, NULL, NULL, 0,
                                               scales + i * TILE, NULL}, M, N, i, NULL, out);
    }
    free(mem);
    return 0;
}

int fleet_int4_quads(int64_t K, int64_t G) {
    return fleet_amx_ready() ? 0 : (int)x_group(FMT_INT4Q, K, G);
}

/* int4 quads at every row count. Each thread its share of the tiles in order (the stream the
 * hardware prefetchers follow, and fleet_quads_prefetch's), the rows in blocks of up to DB, the
 * nibbles split in registers; from fleet_quads_split's rows (Intel: past DB) each tile's
 * nibbles split into a buffer once instead, the row blocks then reading bytes, as the int8
 * calls read tile_layout's. */
int fleet_linear_quads(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                       const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    const int64_t xg = fleet_int4_quads(K, G);
    if (!xg || M < 0 || N < 1) return 1;
    if (M == 0) return 0;
    const int64_t tiles = (N + TILE - 1) / TILE;
    const int split_from = fleet_quads_split(-2), split_it = split_from > 0 && M >= split_from;
    const int pf = split_it ? 0 : fleet_quads_prefetch(-2);
    planes_t p;
    void *mem = x_planes(M, K, xg, &p);
    int failed = !mem;
    if (!failed) {
        #pragma omp parallel num_threads(num_threads) if (tiles > 1 && M * N * K >= 65536)
        {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) x_digits(x, r, K, xg, 1, p.hi, p.lo, p.xs, p.xsum);
            uint8_t *split = split_it ? aligned_alloc(64, (size_t)(K * TILE)) : NULL;
            if (split_it && !split) failed = 1;
            #pragma omp for schedule(dynamic, split_it ? 1 : (tiles + omp_get_num_threads() - 1) / omp_get_num_threads())
            for (int64_t i = 0; i < tiles; i++) {
                if (split_it && !split) continue;
                const tile_t t = tile_at(FMT_INT4, data, scales, mins, K, G, i);
                if (split)
                    for (int64_t j = 0; j < K / 8; j++) {
                        __m512i a[2], c[2];
                        quad_codes(t.data, NULL, j, a, c);
                        for (int h = 0; h < 2; h++) {
                            _mm512_store_si512(split + j * 256 + 64 * h, a[h]);
                            _mm512_store_si512(split + j * 256 + 128 + 64 * h, c[h]);
                        }
                    }
                run_blocks(int4_blocks, (dblock_t){p, K, G, xg, NULL, NULL, t.data, split, pf, t.scales, t.mins}, M, N,
                           i, bias, out);
            }
            free(split);
        }
    }
    free(mem);
    return failed ? 3 : 0;
}

static int quads_prefetch = -1, quads_split = -1;

/* How far ahead calls over int4 quads that split their nibbles in registers prefetch their
 * stream, in bytes (0: they do not): bytes >= 0 sets it, -1 puts this CPU's default back, -2
 * leaves it; returns it. Speed only. */
int fleet_quads_prefetch(int bytes) {
    if (bytes >= 0) quads_prefetch = bytes & ~63;
    if (bytes == -1 || quads_prefetch < 0) quads_prefetch = fleet_cpu_is_intel() ? PF_QUADS_INTEL : PF_QUADS_AMD;
    return quads_prefetch;
}

/* From how many rows calls over int4 quads split each tile's nibbles into a buffer once
 * (0: never; the row blocks then split them in registers, tile by tile, as calls of up to DB
 * rows always do): rows >= 0 sets it, -1 this CPU's default, -2 leaves it; returns it. Speed
 * only. Intel: past DB rows (measured there against the path before quads: README, "int4 as
 * quads"). AMD: never: on Zen 4 (family 25 model 17, 2 cores, 30 layers' projections from
 * Python, interleaved, medians of 5-9) registers and the prefetch took 0.67 / 0.74 / 0.75 /
 * 0.81 / 0.89 / 0.86 / 0.94 / 0.96 / 0.92 / 1.01x the split buffer's time at 7 / 8 / 10 / 12 /
 * 16 / 24 / 32 / 64 / 128 / 512 rows. */
int fleet_quads_split(int rows) {
    if (rows >= 0) quads_split = rows;
    if (rows == -1 || quads_split < 0) quads_split = fleet_cpu_is_intel() ? DB + 1 : 0;
    return quads_split;
}

static int from_rows = DIGIT_ROWS;

/* The rows from which per-channel int8 calls take this path (0: never; so on CPUs with AMX,
 * whose split path serves them); rows >= 0 sets it (1: every call, for the tests; 0 turns it
 * off), -1 leaves it. int4 quads take it at every row count whatever it says. */
int fleet_digit_tuning(int rows) {
    if (rows >= 0) from_rows = rows;
    return fleet_amx_ready() ? 0 : from_rows;
}

#else   /* no AVX512_VNNI here: int8 keeps linear.c's float path, and int4 is packed in k pairs */
int fleet_linear_digits(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                        const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)fmt, (void)x, (void)M, (void)N, (void)K, (void)G, (void)data, (void)scales, (void)mins, (void)bias;
    (void)out, (void)num_threads;
    return 1;
}

int fleet_int8_lay(const void *data, int64_t N, int64_t K, int8_t *w, int32_t *comp) {
    (void)data, (void)N, (void)K, (void)w, (void)comp;
    return 1;
}

int fleet_linear_int8_laid(const float *x, int64_t M, int64_t N, int64_t K, const int8_t *w, const int32_t *comp,
                           const float *scales, float *out, int num_threads) {
    (void)x, (void)M, (void)N, (void)K, (void)w, (void)comp, (void)scales, (void)out, (void)num_threads;
    return 1;
}

int fleet_int4_quads(int64_t K, int64_t G) {
    (void)K, (void)G;
    return 0;
}

int fleet_linear_quads(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                       const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)x, (void)M, (void)N, (void)K, (void)G, (void)data, (void)scales, (void)mins, (void)bias, (void)out;
    (void)num_threads;
    return 1;
}

int fleet_digit_tuning(int rows) {
    (void)rows;
    return 0;
}

int fleet_quads_prefetch(int bytes) {
    (void)bytes;
    return 0;
}

int fleet_quads_split(int rows) {
    (void)rows;
    return 0;
}
#endif

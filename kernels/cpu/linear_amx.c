/* bf16 matmuls on Intel AMX (the tile matrix multiply unit of Xeon Sapphire Rapids and later):
 * y = bf16(x) W^T (+ b) over the bf16 tiles of linear.py, for fleet_linear's calls of at least
 * AMX_ROWS rows (linear.h). Each product of two bf16 values is exact in float32 and the sums are
 * float32, so the one difference from the AVX-512 bf16 path is that x is rounded to bf16
 * (nearest even) first, as oneDNN's and vLLM's bf16 matmuls do.
 *
 * Per call, x is converted once (by all threads, in row blocks) into a bf16 copy laid out as
 * its A tiles one after another, rows padded to a multiple of 32, in a buffer kept per thread.
 * Each thread takes a contiguous run of weight tiles (32 output channels each) and re-lays
 * them, a group of up to GROUP_BYTES at a time, into the pair-interleaved layout TDPBF16PS
 * reads (k and k + 1 of a channel side by side: "VNNI") in a buffer of its own; each 32-row
 * block of x then runs against every tile of the group (x in L1, the weights in L2): two A
 * tiles (16 rows x 32 k), two B tiles (32 k x 16 channels) and four float32 accumulator tiles
 * per step of 32 k.
 *
 * int8 and int4 of at least AMX_SPLIT_ROWS rows run here as well, without rounding away
 * float32's precision: x is carried as hi + lo, two bf16 (hi = bf16(x), lo = bf16(x - hi)),
 * and so is the weight (each tile decoded to float32, then split), and the products
 * hi*hi + lo*hi + hi*lo are summed in float32 ("bf16x3"; the lo*lo term, below 2^-16 of the
 * product, is dropped). That keeps about 16 of float32's 24 significant bits of each operand,
 * far inside the error of 8- or 4-bit weights. Per-channel int8 codes are exact in bf16, so
 * there w has no lo part and two products are summed, times the channel's scale at the end.
 *
 * W8A8 (linear_w8a8.c) of at least AMX_W8A8_ROWS rows runs here too, on AMX-INT8: its weight tiles
 * ([K/4][32][4], four k of a channel in 32 bits) are already the layout TDPBUSD reads, and
 * its int32 sums are exact, so the results are the same bits as its VNNI path.
 *
 * Built with -march=native where the compiler and the CPU have AMX-TILE, AMX-BF16 and AMX-INT8
 * (every AMX CPU so far has all three); Linux must grant the process the tile state
 * (arch_prctl), asked once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "tile_decode.h"

#if defined(FLEET_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) \
    && defined(__AVX512BF16__) && defined(__AVX512VNNI__) && defined(__linux__)
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_state;   /* 0: not asked yet; 1: granted; -1: refused (the callers keep AVX-512) */

int fleet_amx_ready(void) {
    if (amx_state == 0)   /* a race asks twice and gets the same answer */
        amx_state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return amx_state == 1;
}

int fleet_amx_rows(void) { return fleet_amx_ready() ? AMX_ROWS : 0; }

typedef struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Eight tiles of 16 rows x 64 bytes: 0-3 the accumulators, 4-5 x, 6-7 the weights. */
static void configure_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    _tile_loadconfig(&c);
}

/* The pair-interleaved layout TDPBF16PS reads: vb [K / 2][32][2], row p channels 0-15 then
 * 16-31, each as its (k = 2p, k = 2p + 1) pair. pair_index gives the two permutations. */
static void pair_index(__m512i *first, __m512i *second) {
    uint16_t lo[32], hi[32];
    for (int j = 0; j < 32; j++) {
        lo[j] = (uint16_t)(j / 2 + (j & 1 ? 32 : 0));
        hi[j] = (uint16_t)(16 + j / 2 + (j & 1 ? 32 : 0));
    }
    *first = _mm512_loadu_si512(lo);
    *second = _mm512_loadu_si512(hi);
}

/* Rows k and k + 1 of a bf16 tile (a, b: 32 channels each) into row k / 2 of vb at dst. */
static inline void store_pair(__m512i a, __m512i b, __m512i ilo, __m512i ihi, uint16_t *dst) {
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, ilo, b));
    _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, ihi, b));
}

/* A bf16 tile w [K][32] into vb. */
static void interleave_pairs(const uint16_t *w, int64_t K, uint16_t *vb) {
    __m512i ilo, ihi;
    pair_index(&ilo, &ihi);
    for (int64_t k = 0; k < K; k += 2)
        store_pair(_mm512_loadu_si512(w + k * TILE), _mm512_loadu_si512(w + (k + 1) * TILE), ilo, ihi, vb + k * TILE);
}

/* 32 floats (a: the first 16, b: the rest) as bf16 (nearest even), and what they leave:
 * *lo = bf16(v - hi) where lo is not NULL. */
static inline __m512i split32(__m512 a, __m512 b, __m512i *lo) {
    const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    if (lo) {
        const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
        const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)),
                                                                16));
        *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
    }
    return hi;
}

/* Tile t of an int8 or int4 weight (fmt; FMT_CODES8: per-channel int8's bare codes, exact in
 * bf16, vl NULL) decoded a k pair at a time in registers, split, and laid out as vb: hi into
 * vh, lo into vl. */
AI void split_tile(const int fmt, const tile_t *t, uint16_t *vh, uint16_t *vl) {
    __m512i ilo, ihi, la, lb;
    pair_index(&ilo, &ihi);
    vf w[4], s[2] = {vf_zero(), vf_zero()}, m[2] = {s[0], s[1]};
    const int64_t K = t->k, G = fmt == FMT_CODES8 ? K : t->group;
    for (int64_t g = 0, k0 = 0; k0 < K; g++, k0 += G) {
        if (fmt != FMT_CODES8) group_scales(fmt, t, g, s, m);
        for (int64_t k = k0; k < k0 + G; k += 2) {
            decode(fmt, 0, t, k, s, m, w);
            if (fmt != FMT_INT4) decode(fmt, 0, t, k + 1, s, m, w + 2);
            const __m512i a = split32(w[0], w[1], vl ? &la : NULL), b = split32(w[2], w[3], vl ? &lb : NULL);
            store_pair(a, b, ilo, ihi, vh + k * TILE);
            if (vl) store_pair(la, lb, ilo, ihi, vl + k * TILE);
        }
    }
}

/* Rows r0 .. r0 + 16 of x [M][K] float32 into their bf16 A tiles, 16 rows x 32 k each, one
 * after another along k (xb [Mp / 16][K / 32][16][32]: each tile load reads 1 KiB in a row);
 * rows past M are zero. Where xl is not NULL, what the rounding left goes into xl, laid out
 * the same (split32). */
static void round_rows(const float *x, int64_t M, int64_t K, int64_t r0, uint16_t *xb, uint16_t *xl) {
    for (int r = 0; r < 16; r++) {
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            const int64_t at = r0 * K + k0 * 16 + r * 32;
            if (r0 + r >= M) {
                memset(xb + at, 0, 32 * sizeof(uint16_t));
                if (xl) memset(xl + at, 0, 32 * sizeof(uint16_t));
                continue;
            }
            __m512i lo;
            const float *src = x + (r0 + r) * K + k0;
            _mm512_storeu_si512(xb + at, split32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16), xl ? &lo : NULL));
            if (xl) _mm512_storeu_si512(xl + at, lo);
        }
    }
}

/* A buffer of this thread's, kept between calls (grown as needed, never freed): x's bf16
 * copy (slot 0) and the re-laid weight tiles of a group (slot 1). */
static uint16_t *workspace(int slot, size_t elements) {
    static __thread uint16_t *buf[2];
    static __thread size_t size[2];
    if (elements > size[slot]) {
        free(buf[slot]);
        buf[slot] = aligned_alloc(64, (elements * sizeof(uint16_t) + 63) / 64 * 64);
        size[slot] = buf[slot] ? elements : 0;
    }
    return buf[slot];
}

/* Weight tiles taken per group: as many as fit GROUP_BYTES (in L2), at least one. */
#define GROUP_BYTES (512 * 1024)

static int64_t tiles_per_group(int64_t tile_bytes) {
    return GROUP_BYTES / tile_bytes > 1 ? GROUP_BYTES / tile_bytes : 1;
}

/* The calling OpenMP thread's contiguous run of tiles [*first, *last). */
static void thread_tiles(int64_t tiles, int64_t *first, int64_t *last) {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    *first = tiles * id / nt;
    *last = tiles * (id + 1) / nt;
}

/* One 32 x 32 block of results (c [32][32]) into out: `rows` rows, `cols` channels, times
 * the channels' scale (if any), + bias. */
static void store_block(const float *c, int rows, int cols, const float *scale, const float *bias, float *out,
                        int64_t ldo) {
    const vm mask[2] = {vm_first(cols), vm_first(cols - 16)};
    for (int h = 0; h < 2; h++) {
        const vf b = bias ? vf_load_mask(bias + 16 * h, mask[h]) : vf_zero();
        const vf s = scale ? vf_load(scale + 16 * h) : vf_zero();
        for (int r = 0; r < rows; r++) {
            const vf y = scale ? vf_mul(vf_load(c + r * 32 + 16 * h), s) : vf_load(c + r * 32 + 16 * h);
            vf_store_mask(out + r * ldo + 16 * h, mask[h], vf_add(y, b));
        }
    }
}

/* Accumulators 0-3 into c [32][32] (4-byte sums: float32 or int32). */
static inline void store_accumulators(void *c) {
    _tile_stored(0, c, 128);
    _tile_stored(1, (char *)c + 64, 128);
    _tile_stored(2, (char *)c + 16 * 128, 128);
    _tile_stored(3, (char *)c + 16 * 128 + 64, 128);
}

/* Accumulators 0-3 += the x tiles 4-5 times the weight tiles 6-7. */
static inline void dp_bf16_block(void) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

/* How far ahead (bytes) a weight tile read in place from memory prefetches its own stream
 * into L2: the tile unit idles on that stream (the greedy head's screen, 56 MB for SmolLM2,
 * a few rows). C harness on an Intel Xeon family 6 model 167 (the screen's shape, 49,152 x
 * 576, caches swept before each call, two builds alternating, medians of 11-15): 1 row
 * 0.79-0.82x the time, 9 rows 0.78-0.90x, 16 rows 0.83-0.87x, 32 rows 0.82-0.95x (8-64 KB
 * ahead, into L1 or L2: all 0.78-0.94x but for 8 KB into L1; none: level). */
#define AMX_PF_AHEAD 16384

/* The 32 x 32 block of rows r0 .. r0 + 32 (A tiles a) against one re-laid weight tile vb;
 * pf: vb is read in place from memory (the tiles follow one another), so prefetch ahead. */
static void bf16_block(const uint16_t *a, const uint16_t *vb, int64_t K, float *c, int pf) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        if (pf)   /* the 2 KB of this k0's weights, AMX_PF_AHEAD on */
            for (int o = 0; o < 32 * TILE * 2; o += 64)
                _mm_prefetch((const char *)(vb + k0 * TILE) + AMX_PF_AHEAD + o, _MM_HINT_T2);
        _tile_loadd(4, a + k0 * 16, 64);
        _tile_loadd(5, a + 16 * K + k0 * 16, 64);
        _tile_loadd(6, vb + k0 * TILE, 128);
        _tile_loadd(7, vb + k0 * TILE + 32, 128);
        dp_bf16_block();
    }
    store_accumulators(c);
}

/* y [M][N] = bf16(x) w (+ bias) on the tiles, w either linear.py's bf16 tiles ([K][32] each,
 * laid = 0: re-laid per group into vb) or already in vb's layout (laid = 1: greedy_head.py's
 * pack_pairs, [ceil(N / 32)][K / 2][32][2], read in place). */
static int bf16_tiles(const float *x, int64_t M, int64_t N, int64_t K, const uint16_t *w, int laid,
                      const float *bias, float *out, int num_threads) {
    if (K % 32 || M < 1 || !fleet_amx_ready()) return 1;
    const int64_t Mp = (M + 31) / 32 * 32, tiles = (N + TILE - 1) / TILE;
    const int64_t group = tiles_per_group(K * TILE * (int64_t)sizeof(uint16_t));
    uint16_t *xb = workspace(0, (size_t)(Mp * K));
    if (!xb) return 3;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads) if (tiles > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < Mp; r0 += 16) round_rows(x, M, K, r0, xb, NULL);
        /* Each thread a contiguous run of tiles, in groups: the group's weights (re-laid once,
         * where they need it) stay in L2 while each 32-row block of x (in L1) runs against all
         * of them. */
        int64_t first, last;
        thread_tiles(tiles, &first, &last);
        uint16_t *vb = last > first && !laid ? workspace(1, (size_t)(group * K * TILE)) : NULL;
        float c[32 * 32] __attribute__((aligned(64)));
        if (last > first && !laid && !vb) failed = 3;
        if (last > first && (laid || vb)) {
            configure_tiles();
            for (int64_t g0 = first; g0 < last; g0 += group) {
                const int64_t g1 = g0 + group < last ? g0 + group : last;
                if (!laid)
                    for (int64_t i = g0; i < g1; i++) interleave_pairs(w + i * K * TILE, K, vb + (i - g0) * K * TILE);
                for (int64_t r0 = 0; r0 < Mp; r0 += 32)
                    for (int64_t i = g0; i < g1; i++) {
                        bf16_block(xb + r0 * K, laid ? w + i * K * TILE : vb + (i - g0) * K * TILE, K, c, laid);
                        const int rows = M - r0 < 32 ? (int)(M - r0) : 32;
                        const int cols = tile_cols(N, i);
                        store_block(c, rows, cols, NULL, bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N);
                    }
            }
            _tile_release();
        }
    }
    return failed;
}

int fleet_linear_amx(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                     float *out, int num_threads) {
    return bf16_tiles(x, M, N, K, (const uint16_t *)data, 0, bias, out, num_threads);
}

/* The greedy head's screen (greedy_head.c's fleet_bf16dot) on the tiles: approx [M][N] =
 * bf16(x) . w, w the head packed by greedy_head.py's pack_pairs, which is already vb's layout:
 * no re-laying, each weight tile read once per 32 rows (once in all up to 32 rows, the weights
 * streamed from memory while the tile unit idles). The products of two bf16 values are exact
 * in float32 and the sums float32, rounded to nearest even with denormals flushed, as
 * vdpbf16ps does: the screen's bound holds as it is. */
int fleet_bf16dot_amx(const float *x, int64_t M, int64_t N, int64_t K, const uint16_t *w, float *approx,
                      int num_threads) {
    return bf16_tiles(x, M, N, K, w, 1, NULL, approx, num_threads);
}

/* The 32 x 32 block of rows r0 .. r0 + 32 (A tiles xh, xl: hi and lo) against one split
 * weight tile (vh, vl; vl NULL: w has no lo part): xh*vh + xl*vh (+ xh*vl), per 32 k. */
static void split_block(const uint16_t *xh, const uint16_t *xl, const uint16_t *vh, const uint16_t *vl, int64_t K,
                        float *c) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        _tile_loadd(4, xh + k0 * 16, 64);
        _tile_loadd(5, xh + 16 * K + k0 * 16, 64);
        if (vl) {   /* hi x lo first, while the hi A tiles are loaded */
            _tile_loadd(6, vl + k0 * TILE, 128);
            _tile_loadd(7, vl + k0 * TILE + 32, 128);
            dp_bf16_block();
        }
        _tile_loadd(6, vh + k0 * TILE, 128);
        _tile_loadd(7, vh + k0 * TILE + 32, 128);
        dp_bf16_block();
        _tile_loadd(4, xl + k0 * 16, 64);
        _tile_loadd(5, xl + 16 * K + k0 * 16, 64);
        dp_bf16_block();
    }
    store_accumulators(c);
}

int fleet_amx_split_rows(int fmt) {
    return !fleet_amx_ready() ? 0 : fmt == FMT_INT4 ? AMX_SPLIT_ROWS_INT4 : fmt == FMT_INT8 ? AMX_SPLIT_ROWS : 0;
}

int fleet_amx_w8a8_rows(void) { return fleet_amx_ready() ? AMX_W8A8_ROWS : 0; }

/* int8 / int4 (fleet_linear's formats and arguments) with x and w split into bf16 hi + lo. */
int fleet_linear_amx_split(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                           const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    if (K % 32 || M < 1 || !fleet_amx_ready()) return 1;
    const int channel = fmt == FMT_INT8 && G == K;   /* bare codes: no lo part, the scale after the sum */
    const int planes = channel ? 1 : 2;
    const int64_t Mp = (M + 31) / 32 * 32, tiles = (N + TILE - 1) / TILE;
    const int64_t group = tiles_per_group(planes * K * TILE * (int64_t)sizeof(uint16_t));
    uint16_t *xb = workspace(0, (size_t)(2 * Mp * K));
    if (!xb) return 3;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads) if (tiles > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < Mp; r0 += 16) round_rows(x, M, K, r0, xb, xb + Mp * K);
        int64_t first, last;
        thread_tiles(tiles, &first, &last);
        uint16_t *vb = last > first ? workspace(1, (size_t)(group * planes * K * TILE)) : NULL;
        float c[32 * 32] __attribute__((aligned(64)));
        if (last > first && !vb) failed = 3;
        if (vb) {
            configure_tiles();
            for (int64_t g0 = first; g0 < last; g0 += group) {
                const int64_t g1 = g0 + group < last ? g0 + group : last;
                for (int64_t i = g0; i < g1; i++) {
                    uint16_t *vh = vb + (i - g0) * planes * K * TILE;
                    const tile_t t = tile_at(fmt, data, scales, mins, K, G, i);
                    if (channel) split_tile(FMT_CODES8, &t, vh, NULL);
                    else if (fmt == FMT_INT8) split_tile(FMT_INT8, &t, vh, vh + K * TILE);
                    else split_tile(FMT_INT4, &t, vh, vh + K * TILE);
                }
                for (int64_t r0 = 0; r0 < Mp; r0 += 32)
                    for (int64_t i = g0; i < g1; i++) {
                        const uint16_t *vh = vb + (i - g0) * planes * K * TILE;
                        split_block(xb + r0 * K, xb + Mp * K + r0 * K, vh, channel ? NULL : vh + K * TILE, K, c);
                        const int rows = M - r0 < 32 ? (int)(M - r0) : 32;
                        const int cols = tile_cols(N, i);
                        store_block(c, rows, cols, channel ? (const float *)scales + i * TILE : NULL, bias ? bias + i * TILE : NULL,
                                    out + r0 * N + i * TILE, N);
                    }
            }
            _tile_release();
        }
    }
    return failed;
}

/* The int32 sums of the 32 x 32 block of rows a .. a + 32 (x's codes, rows K apart) and one
 * weight tile w ([K/4][32][4]) into c [32][32]. */
static void w8a8_block(const uint8_t *a, const int8_t *w, int64_t K, int32_t *c) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        _tile_loadd(4, a + k0, K);
        _tile_loadd(5, a + 16 * K + k0, K);
        _tile_loadd(6, w + k0 * TILE, 128);
        _tile_loadd(7, w + k0 * TILE + 64, 128);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    store_accumulators(c);
}

/* y = xs * scale * (sum - comp) (+ b) for `rows` rows and `cols` channels of a block. */
static void w8a8_store(const int32_t *c, int rows, int cols, const float *xs, const float *scale,
                       const int32_t *comp, const float *bias, float *out, int64_t ldo) {
    const vm mask[2] = {vm_first(cols), vm_first(cols - 16)};
    for (int h = 0; h < 2; h++) {
        const __m512 sc = _mm512_loadu_ps(scale + 16 * h);
        const __m512i cp = _mm512_loadu_si512(comp + 16 * h);
        const vf b = bias ? vf_load_mask(bias + 16 * h, mask[h]) : vf_zero();
        for (int r = 0; r < rows; r++) {
            const __m512i sum = _mm512_sub_epi32(_mm512_loadu_si512(c + r * 32 + 16 * h), cp);
            const __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(sc, _mm512_set1_ps(xs[r])));
            vf_store_mask(out + r * ldo + 16 * h, mask[h], vf_add(y, b));
        }
    }
}

/* W8A8 over its VNNI tiles: xu [Mp][K] the codes of x (+128, rows M .. Mp anything), xs [M]
 * their scales; y = xs * scale * (sum - comp) (+ b), in the VNNI path's order of operations.
 * Each thread's tiles go in groups of up to GROUP_BYTES, every 32-row block against the group. */
int fleet_w8a8_amx(const uint8_t *xu, const float *xs, int64_t M, int64_t N, int64_t K, const int8_t *codes,
                   const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads) {
    if (K % 64 || M < 1 || !fleet_amx_ready()) return 1;
    const int64_t Mp = (M + 31) / 32 * 32, tiles = (N + TILE - 1) / TILE;
    const int64_t group = tiles_per_group(K * TILE);
    #pragma omp parallel num_threads(num_threads) if (tiles > 1)
    {
        int64_t first, last;
        thread_tiles(tiles, &first, &last);
        int32_t c[32 * 32] __attribute__((aligned(64)));
        configure_tiles();
        for (int64_t g0 = first; g0 < last; g0 += group) {
            const int64_t g1 = g0 + group < last ? g0 + group : last;
            for (int64_t r0 = 0; r0 < Mp; r0 += 32)
                for (int64_t i = g0; i < g1; i++) {
                    w8a8_block(xu + r0 * K, codes + i * K * TILE, K, c);
                    const int rows = M - r0 < 32 ? (int)(M - r0) : 32;
                    const int cols = tile_cols(N, i);
                    w8a8_store(c, rows, cols, xs + r0, scales + i * TILE, comps + i * TILE,
                               bias ? bias + i * TILE : NULL, out + r0 * N + i * TILE, N);
                }
        }
        _tile_release();
    }
    return 0;
}

#else   /* no AMX here: fleet_linear and fleet_linear_w8a8 keep their AVX-512 or AVX2 paths */

int fleet_amx_ready(void) { return 0; }
int fleet_amx_rows(void) { return 0; }
int fleet_amx_split_rows(int fmt) { (void)fmt; return 0; }
int fleet_amx_w8a8_rows(void) { return 0; }

int fleet_linear_amx_split(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                           const void *scales, const void *mins, const float *bias, float *out, int num_threads) {
    (void)fmt; (void)x; (void)M; (void)N; (void)K; (void)G; (void)data; (void)scales; (void)mins; (void)bias;
    (void)out; (void)num_threads;
    return 1;
}

int fleet_bf16dot_amx(const float *x, int64_t M, int64_t N, int64_t K, const uint16_t *w, float *approx,
                      int num_threads) {
    (void)x; (void)M; (void)N; (void)K; (void)w; (void)approx; (void)num_threads;
    return 1;
}

int fleet_linear_amx(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                     float *out, int num_threads) {
    (void)x; (void)M; (void)N; (void)K; (void)data; (void)bias; (void)out; (void)num_threads;
    return 1;
}

int fleet_w8a8_amx(const uint8_t *xu, const float *xs, int64_t M, int64_t N, int64_t K, const int8_t *codes,
                   const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads) {
    (void)xu; (void)xs; (void)M; (void)N; (void)K; (void)codes; (void)scales; (void)comps; (void)bias; (void)out;
    (void)num_threads;
    return 1;
}
#endif

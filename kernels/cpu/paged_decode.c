/* Paged decode attention for the CPU: one query token per sequence, K/V read in place.
 *
 * The torch path gathers every sequence's K/V blocks into a dense copy and runs SDPA over
 * it; this kernel walks each block table instead and keeps an online softmax (one running
 * max and sum per head, rescaled once per tile of 16 tokens). It reads each K/V byte once
 * and writes nothing but the output.
 *
 * Layouts (all float32, C-contiguous but q's rows, which may be strided: a view of the
 * fused qkv output):
 *   q, out        [n, H, D]
 *   k/v cache     [num_blocks, block_size, KVH, D]
 *   tables        [n, table_stride] int64 block ids; lens [n] int64 context lengths
 * Query head h reads KV head h / G, G = H / KVH (grouped-query attention).
 *
 * The vector path (AVX-512 or AVX2, simd.h) handles one KV head and its G query heads at a time, with G (up to 8)
 * and D (16, 32, 64, 96 or 128) compile-time constants, so that q, the accumulators and the
 * softmax state stay in registers and each K/V row is loaded once for the whole group. It
 * prefetches the K/V rows PF tiles ahead: blocks are scattered, so the hardware
 * prefetchers lose the stream at every block boundary. Other shapes, and machines with
 * neither instruction set, take portable loops.
 *
 * Work is split over (sequence, KV-head range) items with OpenMP, on the thread pool torch
 * already runs (the build links the same libgomp soname). Built at first use by
 * kernels/cpu/__init__.py with -O3 -march=native.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 16
#define PF 2      /* prefetch distance, in tiles */

#include "paged.h"
#include "simd.h"

#if defined(FLEET_SIMD)

/* One KV head and its G query heads; G and NV = D / 16 are constants where decode_groups
 * instantiates it. kc and vc point at the group's first K/V element, q and out at its
 * first query head. */
static inline __attribute__((always_inline)) void decode_group(
        const float *q, const float *kc, const float *vc, const int64_t *table, int64_t len,
        int64_t tok, int64_t blk, int64_t bs, float scale, float *out, const int G, const int NV) {
    vf qv[G][NV], acc[G][NV], m[G], l[G];
    float p[G][TILE] __attribute__((aligned(64)));
    for (int h = 0; h < G; h++) {
        for (int j = 0; j < NV; j++) {
            qv[h][j] = vf_mul(vf_load(q + (h * NV + j) * 16), vf_set1(scale));
            acc[h][j] = vf_zero();
        }
        m[h] = vf_set1(-FLT_MAX);
        l[h] = vf_zero();
    }
    for (int64_t t0 = 0; t0 < len; t0 += TILE) {
        const int nt = len - t0 < TILE ? (int)(len - t0) : TILE;
        const vm valid = vm_first(nt);
        const int64_t base = table[t0 / bs] * blk + (t0 % bs) * tok;
        const float *kb = kc + base, *vb = vc + base;
        if (t0 + PF * TILE < len) {
            const int64_t nx = table[(t0 + PF * TILE) / bs] * blk + ((t0 + PF * TILE) % bs) * tok;
            for (int t = 0; t < TILE; t++)
                for (int j = 0; j < NV; j++) {
                    _mm_prefetch((const char *)(kc + nx + t * tok + 16 * j), _MM_HINT_T0);
                    _mm_prefetch((const char *)(vc + nx + t * tok + 16 * j), _MM_HINT_T0);
                }
        }
        vf part[G][TILE];
        for (int t = 0; t < TILE; t++) {  /* rows past nt are read but masked out */
            const float *kt = kb + (t < nt ? t : 0) * tok;
            vf kv[NV];
            for (int j = 0; j < NV; j++) kv[j] = vf_load(kt + 16 * j);
            for (int h = 0; h < G; h++) {
                vf x = vf_mul(qv[h][0], kv[0]);
                for (int j = 1; j < NV; j++) x = vf_fmadd(qv[h][j], kv[j], x);
                part[h][t] = x;
            }
        }
        for (int h = 0; h < G; h++) {
            const vf s = vf_keep(valid, vf_sum16(part[h]), vf_set1(-INFINITY));
            const vf mx = vf_max(m[h], vf_set1(vf_hmax(s)));
            const vf f = vf_exp(vf_sub(m[h], mx));
            const vf e = vf_keep(valid, vf_exp(vf_sub(s, mx)), vf_zero());
            l[h] = vf_fmadd(l[h], f, vf_set1(vf_sum(e)));
            m[h] = mx;
            vf_store(p[h], e);
            for (int j = 0; j < NV; j++) acc[h][j] = vf_mul(acc[h][j], f);
        }
        for (int64_t t = 0; t < nt; t++)
            for (int j = 0; j < NV; j++) {
                const vf v = vf_load(vb + t * tok + 16 * j);
                for (int h = 0; h < G; h++) acc[h][j] = vf_fmadd(vf_set1(p[h][t]), v, acc[h][j]);
            }
    }
    for (int h = 0; h < G; h++) {
        const vf inv = vf_div(vf_set1(1.f), l[h]);
        for (int j = 0; j < NV; j++) vf_store(out + (h * NV + j) * 16, vf_mul(acc[h][j], inv));
    }
}

/* KV heads [g0, g1) of one sequence through decode_group. */
static void decode_groups(const float *q, const float *kc, const float *vc, const int64_t *table,
                          int64_t len, int64_t KVH, int64_t G, int64_t D, int64_t bs, float scale,
                          int64_t g0, int64_t g1, float *out) {
    const int64_t tok = KVH * D, blk = bs * KVH * D;
    for (int64_t g = g0; g < g1; g++) {
        const float *qg = q + g * G * D, *kg = kc + g * D, *vg = vc + g * D;
        float *og = out + g * G * D;
#define CASE(GG, NN) case GG * 16 + NN: decode_group(qg, kg, vg, table, len, tok, blk, bs, scale, og, GG, NN); break;
#define CASES(NN) CASE(1, NN) CASE(2, NN) CASE(3, NN) CASE(4, NN) CASE(5, NN) CASE(6, NN) CASE(7, NN) CASE(8, NN)
        switch (G * 16 + D / 16) { CASES(1) CASES(2) CASES(4) CASES(6) CASES(8) }
#undef CASES
#undef CASE
    }
}

#define VECTOR_OK(G, D, bs) ((G) <= 8 && VECTOR_SHAPE(D, bs))
#else
#define VECTOR_OK(G, D, bs) 0
#endif

int fleet_paged_decode_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                           const int64_t *tables, int64_t table_stride, const int64_t *lens,
                           int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale,
                           float *out, int num_threads) {
    if (n < 0 || H <= 0 || KVH <= 0 || H % KVH || D <= 0 || D > 512 || bs <= 0) return BAD_SHAPE;
    const int64_t G = H / KVH;
    /* With few sequences, one KV head per item keeps every thread busy; otherwise whole
     * sequences. */
    const int64_t split = n < 2 * (int64_t)num_threads ? KVH : 1, per = KVH / split, items = n * split;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t it = 0; it < items; it++) {
        const int64_t s = it / split, g0 = (it % split) * per, g1 = g0 + per;
        const float *qs = q + s * q_stride;
        float *os = out + s * H * D;
        if (lens[s] <= 0) {
            memset(os + g0 * G * D, 0, sizeof(float) * (g1 - g0) * G * D);
            continue;
        }
#if defined(FLEET_SIMD)
        if (VECTOR_OK(G, D, bs)) {
            decode_groups(qs, k_cache, v_cache, tables + s * table_stride, lens[s], KVH, G, D, bs, scale, g0, g1, os);
            continue;
        }
#endif
        attend_heads_portable(qs, k_cache, v_cache, tables + s * table_stride, lens[s], KVH, G, D, bs, scale,
                              g0 * G, g1 * G, os);
    }
    return OK;
}

/* 1 when the vector path serves this shape: what the tests check both paths against. */
int fleet_paged_decode_vectorized(int64_t H, int64_t KVH, int64_t D, int64_t bs) {
    return KVH > 0 && H % KVH == 0 && VECTOR_OK(H / KVH, D, bs);
}

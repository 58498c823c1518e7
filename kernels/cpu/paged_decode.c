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
 * The vector path (AVX-512 or AVX2, simd.h) keeps, for each KV head, its G query heads' q,
 * accumulators and softmax state, with G (up to 8) and D (16, 32, 64, 96 or 128) compile-time
 * constants, and each K/V row is loaded once for the whole group. A sequence's KV heads go
 * through its tiles of 16 tokens together, up to PASS at a time, so that a pass reads each
 * block's rows in order (12 KiB of K and of V per SmolLM2 block) rather than a third of
 * every row per head: in-process A/B on a 2-core AMD EPYC Zen 4, 64 and 8 sequences of
 * 40-500 tokens over 30 layers of cold caches, 0.84-0.97x the time of one head at a time.
 * It prefetches the K/V rows PF tiles ahead, into L2, each row beside the row of the tile
 * being read (K in the QK loop, V before the P.V loop): blocks are scattered, so the hardware
 * prefetchers lose the stream at every block boundary. Before 2026-12-04 a tile's whole
 * prefetch (384 lines for SmolLM2's three KV heads) went out at once, into L1, which holds 32
 * KiB, less than the 48 KiB two tiles ahead span; in-process A/B on a 2-core AMD EPYC Zen 4,
 * 30 layers of cold, scattered caches, contexts of 40-500 tokens: 0.69x the time at 64
 * sequences, 0.81x at 44, 0.71x at 8 (13.5-17 GB/s of K/V against 9.4-14), bits unchanged.
 * fleet_paged_decode_tuning sets the distance and the cache level (for such A/B runs). A tile
 * whose scores stay below a head's running max skips the rescale (its factor would be exp(0),
 * exactly 1, so the bits are the same): in-process A/B on the 2-core AMD EPYC Zen 4, 30 layers of
 * cold caches on huge pages, 0.92-0.94x the time at 64 sequences of 40-500 tokens, 0.97-0.98x
 * at 16 of ~2,000, level at 8, outputs bit-identical. Other
 * shapes, and machines with neither instruction set, take portable loops.
 *
 * Work is split with OpenMP, on the thread pool torch already runs (the build links the same
 * libgomp soname). With fewer than two sequences a thread, one (sequence, KV head) item at a
 * time. Otherwise (SHARES) each thread takes a contiguous share of the sequences, of
 * near-equal context, and a sequence's last tiles prefetch the first tiles of the next one
 * in its share: with items handed out one at a time, each sequence started cold, and a
 * decode row's context is only a few tiles long (the throughput benchmark's decode steps
 * average 110-280 tokens), so its first tile, K and V read row by row with no prefetch
 * ahead, cost more than the rest. In-process A/B on a 2-core AMD EPYC Zen 4 (family 25 model
 * 17), 30 layers of cold caches on huge pages, blocks scattered over a 4 GiB cache
 * (/tmp harness, alternating, medians of 15): 34 sequences of 40-210 tokens 0.85x the time
 * (21.7 -> 25.5 GB/s of K/V), 64 of 16-60 0.61x (14.4 -> 23.4), 6 of 100-400 0.91x; the
 * same bits. Prefetching each head's share of the next tile in address order instead of
 * row by row read 0.83-0.89x the GB/s of this. Built at first use by
 * kernels/cpu/__init__.py with -O3 -march=native.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#define TILE 16
/* Prefetch distance in tiles (PF in the comments), and whether into L2 (T1) rather than L1:
 * runtime settings (fleet_paged_decode_tuning) so that an A/B runs in one process. */
static int pf_tiles = 2, pf_l2 = 1;

#include "kernels.h"   /* the prototype of fleet_paged_decode_f32 */
#include "paged.h"
#include "simd.h"

#if defined(FLEET_SIMD)

/* The online-softmax state of one KV head's G query heads, in memory: q (times the scale)
 * [G][NV], the accumulators [G][NV], then the running max and sum of each head. */
#define STATE(G, NV) (2 * (G) * (NV) + 2 * (G))
#define MAXG 8
#define MAXNV 8
#define PASS 4    /* KV heads per pass over a sequence's tiles (the states stay in L1) */

AI void group_start(const float *q, float scale, vf *st, const int G, const int NV) {
    for (int h = 0; h < G; h++) {
        for (int j = 0; j < NV; j++) {
            st[h * NV + j] = vf_mul(vf_load(q + (h * NV + j) * 16), vf_set1(scale));
            st[G * NV + h * NV + j] = vf_zero();
        }
        st[2 * G * NV + h] = vf_set1(-FLT_MAX);
        st[2 * G * NV + G + h] = vf_zero();
    }
}

AI void prefetch_row(const float *p) {
    if (pf_l2) _mm_prefetch((const char *)p, _MM_HINT_T1);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* nt (<= TILE) tokens of one KV head (its K rows at kb, V rows at vb, tok floats apart) into st. */
AI void group_tile(const float *kb, const float *vb, const float *nk, const float *nv, int64_t tok, int nt, vf *st,
                   const int G, const int NV) {
    vf *qv = st, *acc = st + G * NV, *m = st + 2 * G * NV, *l = m + G;
    float p[MAXG][TILE] __attribute__((aligned(64)));   /* fixed sizes: no stack juggling per row */
    const vm valid = vm_first(nt);
    vf part[MAXG][TILE];
    for (int t = 0; t < TILE; t++) {  /* rows past nt are read but masked out */
        const float *kt = kb + (t < nt ? t : 0) * tok;
        vf kv[MAXNV];
        if (nk)
            for (int j = 0; j < NV; j++) prefetch_row(nk + t * tok + 16 * j);
        for (int j = 0; j < NV; j++) {
            kv[j] = vf_load(kt + 16 * j);
            VF_IN_REG(kv[j]);
        }
        for (int h = 0; h < G; h++) {
            vf x = vf_mul(qv[h * NV], kv[0]);
            for (int j = 1; j < NV; j++) x = vf_fmadd(qv[h * NV + j], kv[j], x);
            part[h][t] = x;
        }
    }
    for (int h = 0; h < G; h++) {
        const vf s = vf_keep(valid, vf_sum16(part[h]), vf_set1(-INFINITY));
        const float top = vf_hmax(s);
        if (top <= vf_first(m[h])) {   /* the running max holds: f would be exp(0) = 1 exactly */
            const vf e = vf_keep(valid, vf_exp(vf_sub(s, m[h])), vf_zero());
            l[h] = vf_add(l[h], vf_set1(vf_sum(e)));   /* = l * 1 + sum, rounded once: the same bits */
            vf_store(p[h], e);
            continue;
        }
        const vf mx = vf_max(m[h], vf_set1(top));
        const vf f = vf_exp(vf_sub(m[h], mx));
        const vf e = vf_keep(valid, vf_exp(vf_sub(s, mx)), vf_zero());
        l[h] = vf_fmadd(l[h], f, vf_set1(vf_sum(e)));
        m[h] = mx;
        vf_store(p[h], e);
        for (int j = 0; j < NV; j++) acc[h * NV + j] = vf_mul(acc[h * NV + j], f);
    }
    if (nv)
        for (int t = 0; t < TILE; t++)
            for (int j = 0; j < NV; j++) prefetch_row(nv + t * tok + 16 * j);
    for (int64_t t = 0; t < nt; t++)
        for (int j = 0; j < NV; j++) {
            vf v = vf_load(vb + t * tok + 16 * j);
            VF_IN_REG(v);
            for (int h = 0; h < G; h++) acc[h * NV + j] = vf_fmadd(vf_set1(p[h][t]), v, acc[h * NV + j]);
        }
}

AI void group_finish(const vf *st, float *out, const int G, const int NV) {
    for (int h = 0; h < G; h++) {
        const vf inv = vf_div(vf_set1(1.f), st[2 * G * NV + G + h]);
        for (int j = 0; j < NV; j++) vf_store(out + (h * NV + j) * 16, vf_mul(st[G * NV + h * NV + j], inv));
    }
}

/* KV heads [g0, g1) (at most PASS) of one sequence, G query heads each: every tile of 16
 * tokens is read once for all of them, so a pass streams each block's rows (those heads'
 * part of every token) in order, and prefetches the rows PF tiles ahead. Each head's sums
 * run in the same order as with one head at a time. */
AI void decode_pass(const float *q, const float *kc, const float *vc, const int64_t *table, int64_t len,
                    const int64_t *next_table, int64_t next_len, int64_t KVH, int64_t bs, float scale, int64_t g0,
                    int64_t g1, float *out, const int G, const int NV) {
    const int64_t D = 16 * NV, tok = KVH * D, blk = bs * KVH * D, tiled = (len + TILE - 1) / TILE * TILE;
    vf st[PASS][STATE(G, NV)];
    for (int64_t g = g0; g < g1; g++) group_start(q + g * G * D, scale, st[g - g0], G, NV);
    for (int64_t t0 = 0; t0 < len; t0 += TILE) {
        const int nt = len - t0 < TILE ? (int)(len - t0) : TILE;
        const int64_t base = table[t0 / bs] * blk + (t0 % bs) * tok + g0 * D;
        const int64_t ahead = t0 + pf_tiles * TILE, over = ahead - tiled;   /* over: into the next sequence */
        int64_t nx = -1;
        if (pf_tiles > 0 && ahead < len) nx = table[ahead / bs] * blk + (ahead % bs) * tok + g0 * D;
        else if (pf_tiles > 0 && next_table && over < next_len)
            nx = next_table[over / bs] * blk + (over % bs) * tok + g0 * D;
        for (int64_t g = g0; g < g1; g++) {
            const int64_t o = (g - g0) * D;
            group_tile(kc + base + o, vc + base + o, nx < 0 ? NULL : kc + nx + o, nx < 0 ? NULL : vc + nx + o,
                       tok, nt, st[g - g0], G, NV);
        }
    }
    for (int64_t g = g0; g < g1; g++) group_finish(st[g - g0], out + g * G * D, G, NV);
}

/* KV heads [g0, g1) of one sequence, in passes of up to PASS heads; next_table / next_len:
 * the sequence after it on this thread (NULL: none), whose first tiles the last pass's last
 * tiles prefetch. */
static void decode_groups(const float *q, const float *kc, const float *vc, const int64_t *table,
                          int64_t len, const int64_t *next_table, int64_t next_len, int64_t KVH, int64_t G,
                          int64_t D, int64_t bs, float scale, int64_t g0, int64_t g1, float *out) {
    for (int64_t a = g0; a < g1; a += PASS) {
        const int64_t b = a + PASS < g1 ? a + PASS : g1;
        const int64_t *nt = b == g1 ? next_table : NULL;   /* the last pass runs into the next sequence */
#define CASE(GG, NN) case GG * 16 + NN: \
        decode_pass(q, kc, vc, table, len, nt, next_len, KVH, bs, scale, a, b, out, GG, NN); break;
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

/* KV heads [g0, g1) of sequence s into out; next: the sequence this thread takes after it
 * (-1: none). */
static void decode_one(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                       const int64_t *tables, int64_t table_stride, const int64_t *lens, int64_t s, int64_t next,
                       int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale, int64_t g0, int64_t g1,
                       float *out) {
    const int64_t G = H / KVH;
    const float *qs = q + s * q_stride;
    float *os = out + s * H * D;
    if (lens[s] <= 0) {
        memset(os + g0 * G * D, 0, sizeof(float) * (g1 - g0) * G * D);
        return;
    }
#if defined(FLEET_SIMD)
    if (VECTOR_OK(G, D, bs)) {
        const int go_on = next >= 0 && lens[next] > 0;
        decode_groups(qs, k_cache, v_cache, tables + s * table_stride, lens[s],
                      go_on ? tables + next * table_stride : NULL, go_on ? lens[next] : 0, KVH, G, D, bs, scale,
                      g0, g1, os);
        return;
    }
#endif
    (void)next;
    attend_heads_portable(qs, k_cache, v_cache, tables + s * table_stride, lens[s], KVH, G, D, bs, scale, g0 * G,
                          g1 * G, os);
}

/* The first of the sequences [0, n) that thread th of `threads` takes (th = threads: n):
 * contiguous shares of near-equal context, a sequence going where the middle of its keys
 * falls. */
static int64_t share_start(const int64_t *lens, int64_t n, int64_t total, int th, int threads) {
    if (th <= 0) return 0;
    if (th >= threads) return n;
    int64_t before = 0;
    for (int64_t s = 0; s < n; s++) {
        const int64_t len = lens[s] > 0 ? lens[s] : 0;
        if ((2 * before + len) * threads >= 2 * total * th) return s;
        before += len;
    }
    return n;
}

int fleet_paged_decode_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                           const int64_t *tables, int64_t table_stride, const int64_t *lens,
                           int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale,
                           float *out, int num_threads) {
    if (n < 0 || H <= 0 || KVH <= 0 || H % KVH || D <= 0 || D > 512 || bs <= 0) return BAD_SHAPE;
    if (n < 2 * (int64_t)num_threads) {
        /* Few sequences: one KV head per item keeps every thread busy. */
        #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
        for (int64_t it = 0; it < n * KVH; it++)
            decode_one(q, q_stride, k_cache, v_cache, tables, table_stride, lens, it / KVH, -1, H, KVH, D, bs,
                       scale, it % KVH, it % KVH + 1, out);
        return OK;
    }
    /* Otherwise whole sequences, a contiguous share per thread (SHARES above). */
    int64_t total = 0;
    for (int64_t s = 0; s < n; s++) total += lens[s] > 0 ? lens[s] : 0;
    #pragma omp parallel num_threads(num_threads)
    {
        const int th = omp_get_thread_num(), threads = omp_get_num_threads();
        const int64_t s0 = share_start(lens, n, total, th, threads), s1 = share_start(lens, n, total, th + 1, threads);
        for (int64_t s = s0; s < s1; s++)
            decode_one(q, q_stride, k_cache, v_cache, tables, table_stride, lens, s, s + 1 < s1 ? s + 1 : -1, H, KVH,
                       D, bs, scale, 0, KVH, out);
    }
    return OK;
}

int fleet_paged_decode_tuning(int tiles, int l2) {
    if (tiles >= 0) pf_tiles = tiles;
    if (l2 >= 0) pf_l2 = l2;
    return pf_tiles | pf_l2 << 8;
}

/* 1 when the vector path serves this shape: what the tests check both paths against. */
int fleet_paged_decode_vectorized(int64_t H, int64_t KVH, int64_t D, int64_t bs) {
    return KVH > 0 && H % KVH == 0 && VECTOR_OK(H / KVH, D, bs);
}

/* Causal attention for prefill chunks on the CPU, K/V read in place from the paged cache.
 *
 * The torch path runs one SDPA call per chunk, and for a chunk with a cached prefix it first
 * gathers the whole context out of the cache and builds a mask. This kernel reads the
 * chunk's K/V blocks where they are (its own new K/V included: they are stored before
 * attention runs) and never looks at a key past a row's own position.
 *
 * Layouts (all float32; q's rows may be strided, heads dense):
 *   q, out        [num_tokens, H, D]; out contiguous
 *   k/v cache     [num_blocks, block_size, KVH, D]
 *   tables        [n, table_stride] int64 block ids of each chunk's sequence
 *   chunks        [n, 3] int64: first row in q/out, rows (query length), context length
 * Row i of a chunk sits at position ctx - rows + i and attends keys 0..that position.
 *
 * A work item is one KV head and up to ROWS / G consecutive positions of one chunk: a
 * block of (position, query head) rows that share every K/V tile. Per key tile of 16
 * tokens the item transposes K once (to [D, 16]), so that a row's 16 scores are one vector
 * of FMAs with no horizontal sums; the online softmax then works on that vector, and P·V
 * adds each tile's V rows into accumulators kept in L1. On the 2-core AMD EPYC measured
 * (float32 matmul peak ~520 GFLOP/s) it ran at 170 GFLOP/s on the benchmark's 64 prompts
 * of 8-384 tokens and 260 on prompts of 1-4k, 1.7-2.4x torch's flash SDPA.
 * Shapes the vector path (AVX-512 or AVX2, simd.h) does not take (head_dim other than
 * 16/32/64/96/128, block_size not a multiple of 16, groups over ROWS heads, neither
 * instruction set) run the portable loops of paged.h.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "paged.h"
#include "simd.h"

#define ROWS 64      /* (position, head) rows per work item at most */
#define DMAX 128

#if defined(FLEET_SIMD)

/* Positions [i0, i0 + ni) of one chunk (position of row 0: first), KV head g and its G
 * query heads. kc/vc point at KV head g's first element. NV = D / 16, a constant where
 * prefill_rows instantiates it. */
static inline __attribute__((always_inline)) void prefill_item(
        const float *q, int64_t q_stride, const float *kc, const float *vc, const int64_t *table,
        int64_t first, int64_t i0, int64_t ni, int64_t g, int64_t G, int64_t tok, int64_t blk, int64_t bs,
        float scale, float *out, int64_t out_stride, const int NV) {
    const int D = NV * 16;
    const int64_t R = ni * G, RP = (R + 7) & ~(int64_t)7;
    float Q[ROWS][DMAX] __attribute__((aligned(64))), O[ROWS][DMAX] __attribute__((aligned(64)));
    float KT[DMAX][16] __attribute__((aligned(64))), P[ROWS][16] __attribute__((aligned(64)));
    float M[ROWS], L[ROWS], F[ROWS];
    int64_t lim[ROWS];
    for (int64_t r = 0; r < RP; r++) {   /* rows past R repeat the last row; never stored */
        const int64_t rr = r < R ? r : R - 1, i = i0 + rr / G, h = g * G + rr % G;
        for (int j = 0; j < NV; j++) {
            vf_store(Q[r] + 16 * j, vf_mul(vf_load(q + i * q_stride + h * D + 16 * j), vf_set1(scale)));
            vf_store(O[r] + 16 * j, vf_zero());
        }
        M[r] = -FLT_MAX, L[r] = 0.f, lim[r] = first + i;
    }
    const int64_t last = first + i0 + ni - 1;   /* the latest position: lim of the last rows */
    for (int64_t t0 = 0; t0 <= last; t0 += 16) {
        const int64_t base = table[t0 / bs] * blk + (t0 % bs) * tok;  /* the tile lies in one block */
        const float *kb = kc + base, *vb = vc + base;
        const int nt = last + 1 - t0 < 16 ? (int)(last + 1 - t0) : 16;   /* keys of the tile some row sees */
        if (t0 + 16 <= last) {
            const int64_t nx = table[(t0 + 16) / bs] * blk + ((t0 + 16) % bs) * tok;
            for (int t = 0; t < 16; t++)
                for (int j = 0; j < NV; j++) {
                    _mm_prefetch((const char *)(kc + nx + t * tok + 16 * j), _MM_HINT_T0);
                    _mm_prefetch((const char *)(vc + nx + t * tok + 16 * j), _MM_HINT_T0);
                }
        }
        /* K rows of the tile past the context hold other data or zeros: read, then masked. */
        for (int j = 0; j < NV; j++) {
            vf rows[16];
            for (int t = 0; t < 16; t++) rows[t] = vf_load(kb + t * tok + 16 * j);
            vf_transpose16(rows, KT[16 * j], 16);
        }
        for (int64_t r0 = 0; r0 < RP; r0 += 8) {
            vf s[8];
            for (int r = 0; r < 8; r++) s[r] = vf_zero();
            for (int d = 0; d < D; d++) {
                const vf kt = vf_load(KT[d]);
                for (int r = 0; r < 8; r++) s[r] = vf_fmadd(vf_set1(Q[r0 + r][d]), kt, s[r]);
            }
            for (int r = 0; r < 8; r++) {
                const int64_t rr = r0 + r;
                /* the row sees keys t0 .. lim: the first `seen` lanes of the tile */
                const int seen = lim[rr] - t0 + 1 > 16 ? 16 : (int)(lim[rr] - t0 + 1);
                if (seen <= 0) {  /* every key of the tile is in this row's future */
                    F[rr] = 1.f;
                    vf_store(P[rr], vf_zero());
                    continue;
                }
                const vm ok = vm_first(seen);
                const float mx = fmaxf(M[rr], vf_hmax(vf_keep(ok, s[r], vf_set1(-INFINITY))));
                const vf e = vf_keep(ok, vf_exp(vf_sub(s[r], vf_set1(mx))), vf_zero());
                F[rr] = expf(M[rr] - mx);
                L[rr] = L[rr] * F[rr] + vf_sum(e);
                M[rr] = mx;
                vf_store(P[rr], e);
            }
        }
        for (int64_t r0 = 0; r0 < RP; r0 += 4) {
            vf acc[4][NV];
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < NV; j++) acc[r][j] = vf_mul(vf_load(O[r0 + r] + 16 * j), vf_set1(F[r0 + r]));
            for (int t = 0; t < nt; t++)    /* V rows past the context are never read */
                for (int j = 0; j < NV; j++) {
                    const vf v = vf_load(vb + t * tok + 16 * j);
                    for (int r = 0; r < 4; r++) acc[r][j] = vf_fmadd(vf_set1(P[r0 + r][t]), v, acc[r][j]);
                }
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < NV; j++) vf_store(O[r0 + r] + 16 * j, acc[r][j]);
        }
    }
    for (int64_t r = 0; r < R; r++) {
        const int64_t i = i0 + r / G, h = g * G + r % G;
        const vf inv = vf_set1(1.f / L[r]);
        for (int j = 0; j < NV; j++) vf_store(out + i * out_stride + h * D + 16 * j, vf_mul(vf_load(O[r] + 16 * j), inv));
    }
}

static void prefill_rows(const float *q, int64_t q_stride, const float *kc, const float *vc, const int64_t *table,
                         int64_t first, int64_t i0, int64_t ni, int64_t g, int64_t G, int64_t KVH, int64_t D,
                         int64_t bs, float scale, float *out, int64_t out_stride) {
    const int64_t tok = KVH * D, blk = bs * KVH * D;
#define CASE(NN) case NN: prefill_item(q, q_stride, kc + g * D, vc + g * D, table, first, i0, ni, g, G, tok, blk, bs, \
                                        scale, out, out_stride, NN); break;
    switch (D / 16) { CASE(1) CASE(2) CASE(4) CASE(6) CASE(8) }
#undef CASE
}

#define VECTOR_OK(G, D, bs) ((G) <= ROWS && VECTOR_SHAPE(D, bs))
#else
#define VECTOR_OK(G, D, bs) 0
#endif

int fleet_paged_prefill_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                            const int64_t *tables, int64_t table_stride, const int64_t *chunks, int64_t n,
                            int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale, float *out,
                            int num_threads) {
    if (n < 0 || H <= 0 || KVH <= 0 || H % KVH || D <= 0 || D > 512 || bs <= 0) return BAD_SHAPE;
    const int64_t G = H / KVH, per = VECTOR_OK(G, D, bs) ? ROWS / G : 1;
    int64_t start[n + 1];    /* first work item of each chunk */
    start[0] = 0;
    for (int64_t c = 0; c < n; c++) {
        const int64_t rows = chunks[3 * c + 1], ctx = chunks[3 * c + 2];
        if (rows < 0 || ctx < rows) return BAD_SHAPE;
        start[c + 1] = start[c] + KVH * ((rows + per - 1) / per);
    }
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t it = 0; it < start[n]; it++) {
        int64_t c = 0;
        while (start[c + 1] <= it) c++;
        const int64_t k = it - start[c], tiles = (start[c + 1] - start[c]) / KVH;
        /* Latest positions first: they have the most keys, so the long items start early. */
        const int64_t g = k / tiles, i0 = (tiles - 1 - k % tiles) * per;
        const int64_t row0 = chunks[3 * c], rows = chunks[3 * c + 1], first = chunks[3 * c + 2] - rows;
        const int64_t ni = rows - i0 < per ? rows - i0 : per;
        const float *qc = q + row0 * q_stride;
        float *oc = out + row0 * H * D;
        const int64_t *table = tables + c * table_stride;
#if defined(FLEET_SIMD)
        if (VECTOR_OK(G, D, bs)) {
            prefill_rows(qc, q_stride, k_cache, v_cache, table, first, i0, ni, g, G, KVH, D, bs, scale, oc, H * D);
            continue;
        }
#endif
        for (int64_t i = i0; i < i0 + ni; i++)
            attend_heads_portable(qc + i * q_stride, k_cache, v_cache, table, first + i + 1, KVH, G, D, bs, scale,
                                  g * G, (g + 1) * G, oc + i * H * D);
    }
    return OK;
}

/* 1 when the vector path serves this shape. */
int fleet_paged_prefill_vectorized(int64_t H, int64_t KVH, int64_t D, int64_t bs) {
    return KVH > 0 && H % KVH == 0 && VECTOR_OK(H / KVH, D, bs);
}

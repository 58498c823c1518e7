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
 * block of (position, query head) rows that share every K/V tile. Keys go in steps of KEYS
 * (64: four tiles of 16, each inside one block). Per step the item transposes K once (to
 * [D, 64]), so that QK^T is a small matmul of register blocks (QR rows x 4 key vectors,
 * no horizontal sums); the online softmax then takes one max, one rescale and one sum per
 * row per step; P.V adds the step's V rows into accumulators kept in L1. A row block stops
 * at the last tile any of its rows sees, and the loaded K^T and V vectors are held in
 * registers (VF_IN_REG: gcc had folded each into every FMA that used it, four loads where
 * one does). First version (2026-11) on the 2-core AMD EPYC measured (float32 matmul peak
 * ~520 GFLOP/s): 170 GFLOP/s on the benchmark's 64 prompts of 8-384 tokens and 260 on
 * prompts of 1-4k, 1.7-2.4x torch's flash SDPA; it took keys 16 at a time. The steps of 64
 * and the registers, in-process A/B on a 2-core AMD EPYC Zen 4 (family 25 model 17),
 * SmolLM2's 30 layers of scattered blocks (/tmp harness, alternating, medians of 8): the
 * throughput benchmark's 64 prompts 0.87-0.88x the time (85 -> 103-108 GFLOP/s), 512 rows
 * after a cached prefix of 3,584 0.79-0.83x (125 -> 161 GFLOP/s); the AVX2 build of the
 * same source on that CPU 0.86x / 0.88x. Its results are the AVX-512 build's bits.
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
#define KEYS 64      /* keys per online-softmax step: SUB tiles of 16, each inside one block */
#define SUB (KEYS / 16)
_Static_assert(KEYS == 64, "prefill_item's switch over a row block's tiles takes 1-4");
#if defined(FLEET_AVX512)
#define QR 4         /* rows per QK register block: QR x SUB accumulators (16 zmm) */
#else
#define QR 1         /* AVX2: SUB accumulators of two ymm each */
#endif
#define PR 4         /* rows per P.V register block: PR x D / 16 accumulators */

#if defined(FLEET_SIMD)

/* Scores of rows [r0, r0 + QR) against the first NS tiles of the step's keys:
 * S[r][k] = sum over d of Q[r][d] KT[d][k], d in order (the same sums whatever NS). */
AI void qk_block(const float (*Q)[DMAX], const float (*KT)[KEYS], float (*S)[KEYS], int64_t r0, const int NS,
                 const int D) {
    vf acc[QR][SUB];
    for (int r = 0; r < QR; r++)
        for (int s = 0; s < NS; s++) acc[r][s] = vf_zero();
    for (int d = 0; d < D; d++) {
        vf k[SUB];
        for (int s = 0; s < NS; s++) {
            k[s] = vf_load(KT[d] + 16 * s);
            VF_IN_REG(k[s]);
        }
        for (int r = 0; r < QR; r++) {
            const vf qd = vf_set1(Q[r0 + r][d]);
            for (int s = 0; s < NS; s++) acc[r][s] = vf_fmadd(qd, k[s], acc[r][s]);
        }
    }
    for (int r = 0; r < QR; r++)
        for (int s = 0; s < NS; s++) vf_store(S[r0 + r] + 16 * s, acc[r][s]);
}

/* Positions [i0, i0 + ni) of one chunk (position of row 0: first), KV head g and its G
 * query heads. kc/vc point at KV head g's first element. NV = D / 16, a constant where
 * prefill_rows instantiates it. The steps of KEYS keys: the file's header. */
static inline __attribute__((always_inline)) void prefill_item(
        const float *q, int64_t q_stride, const float *kc, const float *vc, const int64_t *table,
        int64_t first, int64_t i0, int64_t ni, int64_t g, int64_t G, int64_t tok, int64_t blk, int64_t bs,
        float scale, float *out, int64_t out_stride, const int NV) {
    const int D = NV * 16;
    const int64_t R = ni * G, RP = (R + 7) & ~(int64_t)7;
    float Q[ROWS][DMAX] __attribute__((aligned(64))), O[ROWS][DMAX] __attribute__((aligned(64)));
    float KT[DMAX][KEYS] __attribute__((aligned(64))), S[ROWS][KEYS] __attribute__((aligned(64)));
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
    for (int64_t t0 = 0; t0 <= last; t0 += KEYS) {
        const int64_t nt = last + 1 - t0 < KEYS ? last + 1 - t0 : KEYS;   /* keys of the step some row sees */
        const int ns = (int)((nt + 15) / 16);                             /* their tiles */
        const float *vb[SUB];
        for (int s = 0; s < ns; s++) {
            /* K rows of a tile past the context hold other data or zeros: read, then masked. */
            const int64_t base = table[(t0 + 16 * s) / bs] * blk + ((t0 + 16 * s) % bs) * tok;
            const float *kb = kc + base;
            vb[s] = vc + base;
            for (int j = 0; j < NV; j++) {
                vf rows[16];
                for (int t = 0; t < 16; t++) rows[t] = vf_load(kb + t * tok + 16 * j);
                vf_transpose16(rows, KT[16 * j] + 16 * s, KEYS);
            }
        }
        if (t0 + KEYS <= last) {   /* the next step's tiles, into L2 */
            for (int64_t tn = t0 + KEYS; tn < t0 + 2 * KEYS && tn <= last; tn += 16) {
                const int64_t nx = table[tn / bs] * blk + (tn % bs) * tok;
                for (int t = 0; t < 16; t++)
                    for (int j = 0; j < NV; j++) {
                        _mm_prefetch((const char *)(kc + nx + t * tok + 16 * j), _MM_HINT_T1);
                        _mm_prefetch((const char *)(vc + nx + t * tok + 16 * j), _MM_HINT_T1);
                    }
            }
        }
        for (int64_t r0 = 0; r0 < RP; r0 += QR) {
            const int64_t top = lim[r0 + QR - 1] - t0 + 1;   /* keys the block's latest row sees */
            if (top <= 0) continue;
            const int nb = top >= nt ? ns : (int)((top + 15) / 16);
            switch (nb) {
                case 1: qk_block(Q, KT, S, r0, 1, D); break;
                case 2: qk_block(Q, KT, S, r0, 2, D); break;
                case 3: qk_block(Q, KT, S, r0, 3, D); break;
                default: qk_block(Q, KT, S, r0, SUB, D); break;
            }
        }
        for (int64_t r = 0; r < RP; r++) {   /* S[r] becomes P[r]: exp(s - max), 0 past the row's keys */
            const int64_t seen = lim[r] - t0 + 1 < nt ? lim[r] - t0 + 1 : nt;
            if (seen <= 0) {   /* every key of the step is in this row's future (its P.V block may not be) */
                F[r] = 1.f;
                for (int j = 0; j < SUB; j++) vf_store(S[r] + 16 * j, vf_zero());
                continue;
            }
            const int nr = (int)((seen + 15) / 16);
            vf s[SUB], mv = vf_set1(-INFINITY);
            for (int j = 0; j < nr; j++) {
                s[j] = vf_keep(vm_first((int)(seen - 16 * j)), vf_load(S[r] + 16 * j), vf_set1(-INFINITY));
                mv = vf_max(mv, s[j]);
            }
            const float mx = fmaxf(M[r], vf_hmax(mv));
            vf sum = vf_zero();
            for (int j = 0; j < SUB; j++) {
                const vf e = j < nr ? vf_keep(vm_first((int)(seen - 16 * j)), vf_exp(vf_sub(s[j], vf_set1(mx))),
                                              vf_zero()) : vf_zero();
                sum = vf_add(sum, e);
                vf_store(S[r] + 16 * j, e);
            }
            F[r] = expf(M[r] - mx);
            L[r] = L[r] * F[r] + vf_sum(sum);
            M[r] = mx;
        }
        for (int64_t r0 = 0; r0 < RP; r0 += PR) {
            int64_t tm = lim[r0 + PR - 1] - t0 + 1;   /* keys the block's latest row sees */
            if (tm <= 0) continue;                      /* F = 1 and no keys: O unchanged */
            if (tm > nt) tm = nt;                       /* V rows past the context are never read */
            vf acc[PR][NV];
            for (int r = 0; r < PR; r++)
                for (int j = 0; j < NV; j++) acc[r][j] = vf_mul(vf_load(O[r0 + r] + 16 * j), vf_set1(F[r0 + r]));
            for (int s = 0; 16 * s < tm; s++) {
                const int te = tm - 16 * s < 16 ? (int)(tm - 16 * s) : 16;
                for (int t = 0; t < te; t++)
                    for (int j = 0; j < NV; j++) {
                        vf v = vf_load(vb[s] + t * tok + 16 * j);
                        VF_IN_REG(v);
                        for (int r = 0; r < PR; r++)
                            acc[r][j] = vf_fmadd(vf_set1(S[r0 + r][16 * s + t]), v, acc[r][j]);
                    }
            }
            for (int r = 0; r < PR; r++)
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

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
 * Query head h reads KV head h / (H / KVH) (grouped-query attention).
 *
 * Work is split over (sequence, KV-head range) items with OpenMP, on the thread pool torch
 * already runs (the build links the same libgomp soname). Built at first use by
 * kernels/cpu/__init__.py with -O3 -march=native; the AVX-512 path is used where the
 * compiler targets it, the portable loops elsewhere.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 16

enum { OK = 0, BAD_SHAPE = 1 };

#include "simd.h"

#if defined(__AVX512F__)

/* Lane t of the result = sum of the 16 lanes of v[t] (a transpose-and-add tree). */
static inline __m512 sum16x16(const __m512 *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) {
        const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
        b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

/* Query heads [h0, h1) of one sequence; their KV heads are [h0 / G, (h1 - 1) / G]. */
static void decode_heads(const float *q, const float *kc, const float *vc, const int64_t *table,
                         int64_t len, int64_t KVH, int64_t G, int64_t D, int64_t bs, float scale,
                         int64_t h0, int64_t h1, float *out) {
    const int64_t NV = D / 16, nh = h1 - h0, tok = KVH * D, blk = bs * KVH * D;
    const int64_t g0 = h0 / G, g1 = (h1 - 1) / G + 1;
    __m512 qv[nh * NV], acc[nh * NV], m[nh], l[nh];
    float p[nh][TILE];
    for (int64_t h = 0; h < nh; h++) {
        for (int64_t j = 0; j < NV; j++) {
            qv[h * NV + j] = _mm512_mul_ps(_mm512_loadu_ps(q + (h0 + h) * D + 16 * j), _mm512_set1_ps(scale));
            acc[h * NV + j] = _mm512_setzero_ps();
        }
        m[h] = _mm512_set1_ps(-FLT_MAX);
        l[h] = _mm512_setzero_ps();
    }
    for (int64_t t0 = 0; t0 < len; t0 += TILE) {
        const int64_t nt = len - t0 < TILE ? len - t0 : TILE;
        const __mmask16 valid = (__mmask16)((1u << nt) - 1u);
        const int64_t base = table[t0 / bs] * blk + (t0 % bs) * tok;
        if (t0 + TILE < len) {  /* the next tile may sit in another block: fetch it now */
            const int64_t next = table[(t0 + TILE) / bs] * blk + ((t0 + TILE) % bs) * tok + g0 * D;
            for (int t = 0; t < TILE; t++)
                for (int64_t o = 0; o < (g1 - g0) * D; o += 16) {
                    _mm_prefetch((const char *)(kc + next + t * tok + o), _MM_HINT_T0);
                    _mm_prefetch((const char *)(vc + next + t * tok + o), _MM_HINT_T0);
                }
        }
        for (int64_t h = 0; h < nh; h++) {
            const float *kb = kc + base + ((h0 + h) / G) * D;
            __m512 part[TILE];
            for (int t = 0; t < TILE; t++) {  /* rows past nt are read but masked out */
                __m512 x = _mm512_mul_ps(qv[h * NV], _mm512_loadu_ps(kb + (t < nt ? t : 0) * tok));
                for (int64_t j = 1; j < NV; j++)
                    x = _mm512_fmadd_ps(qv[h * NV + j], _mm512_loadu_ps(kb + (t < nt ? t : 0) * tok + 16 * j), x);
                part[t] = x;
            }
            const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, sum16x16(part));
            const __m512 mx = _mm512_max_ps(m[h], _mm512_set1_ps(_mm512_reduce_max_ps(s)));
            const __m512 f = exp16(_mm512_sub_ps(m[h], mx));
            const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(s, mx)));
            l[h] = _mm512_fmadd_ps(l[h], f, _mm512_set1_ps(_mm512_reduce_add_ps(e)));
            m[h] = mx;
            _mm512_storeu_ps(p[h], e);
            for (int64_t j = 0; j < NV; j++) acc[h * NV + j] = _mm512_mul_ps(acc[h * NV + j], f);
        }
        for (int64_t g = g0; g < g1; g++) {
            const int64_t ha = (g * G > h0 ? g * G : h0) - h0, hb = ((g + 1) * G < h1 ? (g + 1) * G : h1) - h0;
            const float *vb = vc + base + g * D;
            for (int64_t t = 0; t < nt; t++) {
                for (int64_t j = 0; j < NV; j++) {
                    const __m512 v = _mm512_loadu_ps(vb + t * tok + 16 * j);
                    for (int64_t h = ha; h < hb; h++)
                        acc[h * NV + j] = _mm512_fmadd_ps(_mm512_set1_ps(p[h][t]), v, acc[h * NV + j]);
                }
            }
        }
    }
    for (int64_t h = 0; h < nh; h++) {
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l[h]);
        for (int64_t j = 0; j < NV; j++)
            _mm512_storeu_ps(out + (h0 + h) * D + 16 * j, _mm512_mul_ps(acc[h * NV + j], inv));
    }
}
#define VECTOR_OK(D, bs) ((D) % 16 == 0 && (bs) % TILE == 0)
#else
#define VECTOR_OK(D, bs) 0
#endif

/* Portable path: the same online softmax, one token at a time. */
static void decode_heads_portable(const float *q, const float *kc, const float *vc, const int64_t *table,
                                  int64_t len, int64_t KVH, int64_t G, int64_t D, int64_t bs, float scale,
                                  int64_t h0, int64_t h1, float *out) {
    const int64_t tok = KVH * D, blk = bs * KVH * D;
    for (int64_t h = h0; h < h1; h++) {
        float acc[D], m = -FLT_MAX, l = 0.f;
        memset(acc, 0, sizeof acc);
        const float *qh = q + h * D;
        for (int64_t t = 0; t < len; t++) {
            const int64_t at = table[t / bs] * blk + (t % bs) * tok + (h / G) * D;
            float s = 0.f;
            for (int64_t d = 0; d < D; d++) s += qh[d] * kc[at + d];
            s *= scale;
            const float mx = s > m ? s : m, f = expf(m - mx), e = expf(s - mx);
            l = l * f + e;
            m = mx;
            for (int64_t d = 0; d < D; d++) acc[d] = acc[d] * f + e * vc[at + d];
        }
        for (int64_t d = 0; d < D; d++) out[h * D + d] = acc[d] / l;
    }
}

int fleet_paged_decode_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                           const int64_t *tables, int64_t table_stride, const int64_t *lens,
                           int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale,
                           float *out, int num_threads) {
    if (n < 0 || H <= 0 || KVH <= 0 || H % KVH || D <= 0 || D > 512 || bs <= 0) return BAD_SHAPE;
    const int64_t G = H / KVH;
    /* With few sequences, one KV head per item keeps every thread busy; otherwise whole
     * sequences, whose K/V rows are then read front to back. */
    const int64_t split = n < 2 * (int64_t)num_threads ? KVH : 1, items = n * split;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t it = 0; it < items; it++) {
        const int64_t s = it / split, h0 = (it % split) * (H / split), h1 = h0 + H / split;
        const float *qs = q + s * q_stride;
        float *os = out + s * H * D;
        if (lens[s] <= 0) {
            memset(os + h0 * D, 0, sizeof(float) * (h1 - h0) * D);
            continue;
        }
#if defined(__AVX512F__)
        if (VECTOR_OK(D, bs)) {
            decode_heads(qs, k_cache, v_cache, tables + s * table_stride, lens[s], KVH, G, D, bs, scale, h0, h1, os);
            continue;
        }
#endif
        decode_heads_portable(qs, k_cache, v_cache, tables + s * table_stride, lens[s], KVH, G, D, bs, scale, h0, h1, os);
    }
    return OK;
}

/* 1 when the vector path serves this shape: what the tests check both paths against. */
int fleet_paged_decode_vectorized(int64_t D, int64_t bs) { return VECTOR_OK(D, bs); }

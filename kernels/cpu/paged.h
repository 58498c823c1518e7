/* What the paged attention kernels share: return codes and the portable loops. */
#ifndef FLEET_PAGED_H
#define FLEET_PAGED_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { OK = 0, BAD_SHAPE = 1 };

/* The head sizes the AVX-512 paths instantiate (D / 16 vectors of 16 floats per head); both
 * kernels also need whole 16-token tiles inside a block. */
#define VECTOR_SHAPE(D, bs) (((D) == 16 || (D) == 32 || (D) == 64 || (D) == 96 || (D) == 128) && (bs) % 16 == 0)

/* One query row (all H heads at q, dense) over the first len keys of its paged K/V, for
 * query heads [h0, h1): an online softmax one token at a time. Layouts as in the kernels. */
static void attend_heads_portable(const float *q, const float *kc, const float *vc, const int64_t *table,
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

#endif

/* What the packed-weight matmuls (linear.c, linear_w8a8.c) share: the tile width, the
 * register block and the masked store of a block's results. */
#ifndef FLEET_LINEAR_H
#define FLEET_LINEAR_H
#include <stdint.h>

#include "simd.h"

#define TILE 32        /* output channels per tile of a packed weight */
#define RB 8           /* rows per register block */

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define AI static inline __attribute__((always_inline))

/* out[r][0..cols) = acc[r] (+ bias) for R rows; cols <= TILE. */
AI void store_rows(const int R, __m512 acc[RB][2], const float *bias, float *out, int64_t ldo, int cols) {
    const __mmask16 mask[2] = {cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1),
                               cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1)};
    for (int h = 0; h < 2; h++) {
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask[h], bias + 16 * h) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(out + r * ldo + 16 * h, mask[h], _mm512_add_ps(acc[r][h], b));
    }
}
#endif
#endif

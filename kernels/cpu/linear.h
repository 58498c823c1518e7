/* What the packed-weight matmuls (linear.c, linear_w8a8.c) share: the tile width, the
 * register block and the masked store of a block's results. */
#ifndef FLEET_LINEAR_H
#define FLEET_LINEAR_H
#include <stdint.h>

#include "simd.h"

#define TILE 32        /* output channels per tile of a packed weight */

#if defined(FLEET_AVX512)
#define RB 8           /* rows per register block (32 zmm registers) */
/* Accumulator sets for a block of R rows (independent chains of fused multiply-adds; S x R <= RB). */
#define SETS(R) ((R) == 1 ? 4 : (R) <= RB / 2 ? 2 : 1)
#define SETS_INT4(R) ((R) == 1 ? 4 : (R) == 2 ? 2 : 1)
#elif defined(FLEET_AVX2)
#define RB 3           /* 16 ymm registers: a vf of 16 floats takes two */
#define SETS(R) ((R) == 1 ? 2 : 1)
#define SETS_INT4(R) SETS(R)
#endif

#if defined(FLEET_SIMD)
/* out[r][0..cols) = acc[r] (+ bias) for R rows; cols <= TILE. */
AI void store_rows(const int R, vf acc[RB][2], const float *bias, float *out, int64_t ldo, int cols) {
    if (cols == TILE) {   /* whole tiles without masks (AVX2's masked moves are slow) */
        for (int h = 0; h < 2; h++) {
            const vf b = bias ? vf_load(bias + 16 * h) : vf_zero();
            for (int r = 0; r < R; r++) vf_store(out + r * ldo + 16 * h, vf_add(acc[r][h], b));
        }
        return;
    }
    const vm mask[2] = {vm_first(cols), vm_first(cols - 16)};
    for (int h = 0; h < 2; h++) {
        const vf b = bias ? vf_load_mask(bias + 16 * h, mask[h]) : vf_zero();
        for (int r = 0; r < R; r++) vf_store_mask(out + r * ldo + 16 * h, mask[h], vf_add(acc[r][h], b));
    }
}
#endif
#endif

/* The element-wise glue between a Llama layer's matmuls, one pass each, for the CPU path.
 *
 * In torch each of these is 5-25 small ops (each a dispatch and a pass over memory); here
 * each is one call. Rounding follows Hugging Face's float32 formulas: RoPE is
 * x1*cos - x2*sin with each product rounded (the file is built with -ffp-contract=off, so
 * no fused multiply-adds change that); RMSNorm is x * (1/sqrt(mean(x^2) + eps)) * w, whose
 * sum of squares may differ from torch's in summation order only.
 *
 * All float32, rows C-contiguous unless a row stride is given. Rows are split over OpenMP
 * threads when there are enough of them to pay for the fork.
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"   /* the prototypes of the functions defined here */
#include "simd.h"

#define PAR_ROWS 8   /* fewer rows than this run on the calling thread */

/* The vector instruction set the kernels were built for (simd.h): 2 AVX-512, 1 AVX2, 0 none. */
int fleet_simd(void) {
#if defined(FLEET_AVX512)
    return 2;
#elif defined(FLEET_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* residual += x (when residual is given), out = rms_norm(residual or x) * w; [n, h] each. */
int fleet_add_rms_norm_f32(const float *x, float *residual, const float *w, float *out,
                           int64_t n, int64_t h, float eps, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= PAR_ROWS)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * h;
        float *src = (float *)xr;
        if (residual) {
            src = residual + r * h;
            for (int64_t i = 0; i < h; i++) src[i] += xr[i];
        }
        float ss = 0.f;
        #pragma omp simd reduction(+:ss)
        for (int64_t i = 0; i < h; i++) ss += src[i] * src[i];
        const float inv = 1.f / sqrtf(ss / (float)h + eps);
        float *o = out + r * h;
        for (int64_t i = 0; i < h; i++) o[i] = w[i] * (src[i] * inv);
    }
    return 0;
}

/* Rotate-half RoPE in place on q [n, H, D] and k [n, KVH, D] (rows strided, heads dense),
 * at positions[n], with cos/sin tables [*, D] whose two halves repeat. */
int fleet_rope_f32(float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t n, int64_t H,
                   int64_t KVH, int64_t D, const int64_t *positions, const float *cos_table,
                   const float *sin_table, int64_t table_stride, int num_threads) {
    const int64_t half = D / 2;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= PAR_ROWS)
    for (int64_t r = 0; r < n; r++) {
        const float *c = cos_table + positions[r] * table_stride, *s = sin_table + positions[r] * table_stride;
        for (int64_t head = 0; head < H + KVH; head++) {
            float *x = head < H ? q + r * q_stride + head * D : k + r * k_stride + (head - H) * D;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                const float a = x1 * c[i], b = x2 * s[i], e = x2 * c[i], f = x1 * s[i];
                x[i] = a - b;
                x[i + half] = e + f;
            }
        }
    }
    return 0;
}

/* out[n, I] = silu(x[:, :I]) * x[:, I:], x [n, 2I]. */
int fleet_silu_mul_f32(const float *x, float *out, int64_t n, int64_t inter, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= PAR_ROWS)
    for (int64_t r = 0; r < n; r++) {
        const float *g = x + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
#if defined(FLEET_SIMD)
        for (; i + 16 <= inter; i += 16) {
            vf_store(o + i, vf_silu_mul(vf_load(g + i), vf_load(u + i)));
        }
#endif
        for (; i < inter; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
    return 0;
}

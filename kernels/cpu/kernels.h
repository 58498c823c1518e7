/* The kernels that the one-call paths (decode_layers.c, greedy_head.c) chain, as other C files
 * call them: the glue between matmuls (glue.c), decode attention (paged_decode.c) and the
 * matmuls (linear.c, linear_w8a8.c). Prototypes only, no macros, so any file may include it
 * (the files that define these include it too, so the compiler checks each against its
 * definition). */
#ifndef FLEET_KERNELS_H
#define FLEET_KERNELS_H
#include <stdint.h>

int fleet_add_rms_norm_f32(const float *x, float *residual, const float *w, float *out, int64_t n, int64_t h,
                           float eps, int num_threads);
int fleet_rope_f32(float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t n, int64_t H, int64_t KVH,
                   int64_t D, const int64_t *positions, const float *cos_table, const float *sin_table,
                   int64_t table_stride, int num_threads);
int fleet_silu_mul_f32(const float *x, float *out, int64_t n, int64_t inter, int num_threads);
int fleet_paged_decode_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                           const int64_t *tables, int64_t table_stride, const int64_t *lens, int64_t n, int64_t H,
                           int64_t KVH, int64_t D, int64_t bs, float scale, float *out, int num_threads);
int fleet_linear_w8a8(const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const int8_t *codes,
                      const float *scales, const int32_t *comps, const float *bias, float *out, int num_threads);
int fleet_linear(int fmt, const float *x, int64_t M, int64_t N, int64_t K, int64_t G, const void *data,
                 const void *scales, const void *mins, const float *bias, float *out, int num_threads);
int fleet_linear_silu_mul(const float *x, int64_t M, int64_t N, int64_t K, const void *data, const float *bias,
                          float *out, int num_threads);
#endif

/* A decode step's decoder layers in one call: for rows that each feed one new token, every
 * layer of a Llama-family model (RMSNorm, fused q/k/v projection, RoPE, the K/V store,
 * paged attention, output projection, RMSNorm, fused gate/up projection, SiLU-and-mul
 * (one call with the projection where linear.c's fleet_linear_silu_mul serves it), down projection) runs here, back to back, on the kernels the per-op path calls one by
 * one from Python (glue.c, linear.c, paged_decode.c).
 *
 * At batch 1 a layer's own work is ~0.2 ms of matmuls while the per-op path spends about
 * as much again on Python: nine ctypes calls, their argument checks, tensor allocations
 * and views, per layer. This file takes that out; it computes nothing differently. The
 * same functions run in the same order on the same bytes, so the results are bitwise those
 * of the per-op path (tests/kernels/test_cpu_decode_layers.py checks it).
 *
 * Buffers (float32, C-contiguous): x [n, hidden] holds the layer input and, on return, the
 * last layer's output; residual [n, hidden] the residual stream (when `first`, it is empty
 * and layer 0 copies x into it, as the per-op path aliases it); scratch holds the step's
 * intermediates (see fleet_decode_scratch).
 */
#include <stdint.h>
#include <string.h>

#include "linear.h"

#define FMT_W8A8 4   /* after linear.c's f32, bf16, int8, int4: the W8A8 kernel (linear_w8a8.c) */

typedef struct {        /* one packed projection (linear.py's PackedWeight) */
    int64_t fmt, n, k, group;   /* fmt: linear.c's format code, or FMT_W8A8 (group: x's, K for one scale a row) */
    const void *data;
    const void *scales, *mins;  /* int8: float32 scales; int4: fp16 scales and mins; W8A8: float32, int32 */
    const float *bias;
    const float *input_scale;   /* [k] or NULL: y = (x / input_scale) W^T (+ bias) */
} fleet_weight_t;

typedef struct {        /* one decoder layer */
    const float *input_norm, *post_norm;
    fleet_weight_t qkv, o, gate_up, down;
    float *k_cache, *v_cache;   /* [num_blocks, block_size, kv_heads, head_dim] */
} fleet_layer_t;

typedef struct {        /* the step: shapes and the attention plan, shared by every layer */
    int64_t rows, hidden, heads, kv_heads, head_dim, inter, block_size, table_stride, rope_stride;
    float eps, scale;
    const int64_t *positions, *slots, *tables, *lens;   /* [n], [n], [n, table_stride], [n] */
    const float *cos_table, *sin_table;                 /* [*, rope_stride] */
} fleet_step_t;

/* Floats of scratch that fleet_decode_layers needs for n rows. */
int64_t fleet_decode_scratch(const fleet_step_t *s) {
    const int64_t qkv = (s->heads + 2 * s->kv_heads) * s->head_dim;
    const int64_t widest = s->inter > s->hidden ? s->inter : s->hidden;
    return s->rows * (s->hidden + qkv + s->heads * s->head_dim + 3 * s->inter +
                      (widest > s->heads * s->head_dim ? widest : s->heads * s->head_dim));
}

/* out = (x / input_scale) W^T (+ bias); the division (as torch does it, one IEEE division
 * per element) goes through `tmp` [rows, k]. */
static int project(const fleet_weight_t *w, const float *x, int64_t rows, float *out, float *tmp, int threads) {
    if (w->input_scale) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < w->k; i++) tmp[r * w->k + i] = x[r * w->k + i] / w->input_scale[i];
        x = tmp;
    }
    if (w->fmt == FMT_W8A8)
        return fleet_linear_w8a8(x, rows, w->n, w->k, w->group, w->data, w->scales, (const int32_t *)w->mins,
                                 w->bias, out, threads);
    return fleet_linear((int)w->fmt, x, rows, w->n, w->k, w->group, w->data, w->scales, w->mins, w->bias, out,
                        threads);
}

/* 0 on success; otherwise 100 * (layer + 1) + the failing kernel's code (nothing is rolled
 * back: the callers check shapes before they call). */
int fleet_decode_layers(const fleet_layer_t *layers, int64_t num_layers, const fleet_step_t *s, float *x,
                        float *residual, int first, float *scratch, int threads) {
    const int64_t n = s->rows, h = s->hidden, H = s->heads, KVH = s->kv_heads, D = s->head_dim;
    const int64_t width = (H + 2 * KVH) * D, kv = KVH * D;
    float *normed = scratch, *qkv = normed + n * h, *attn = qkv + n * width, *gu = attn + n * H * D;
    float *act = gu + n * 2 * s->inter, *tmp = act + n * s->inter;
    for (int64_t i = 0; i < num_layers; i++) {
        const fleet_layer_t *L = layers + i;
        int rc = 0;
        if (first && i == 0) {
            fleet_add_rms_norm_f32(x, NULL, L->input_norm, normed, n, h, s->eps, threads);
            memcpy(residual, x, sizeof(float) * n * h);
        } else {
            fleet_add_rms_norm_f32(x, residual, L->input_norm, normed, n, h, s->eps, threads);
        }
        rc = project(&L->qkv, normed, n, qkv, tmp, threads);
        if (rc) return 100 * (int)(i + 1) + rc;
        fleet_rope_f32(qkv, width, qkv + H * D, width, n, H, KVH, D, s->positions, s->cos_table, s->sin_table,
                       s->rope_stride, threads);
        for (int64_t r = 0; r < n; r++) {
            memcpy(L->k_cache + s->slots[r] * kv, qkv + r * width + H * D, sizeof(float) * kv);
            memcpy(L->v_cache + s->slots[r] * kv, qkv + r * width + H * D + kv, sizeof(float) * kv);
        }
        rc = fleet_paged_decode_f32(qkv, width, L->k_cache, L->v_cache, s->tables, s->table_stride, s->lens, n,
                                    H, KVH, D, s->block_size, s->scale, attn, threads);
        if (rc) return 100 * (int)(i + 1) + 10 + rc;
        if ((rc = project(&L->o, attn, n, x, tmp, threads))) return 100 * (int)(i + 1) + rc;
        fleet_add_rms_norm_f32(x, residual, L->post_norm, normed, n, h, s->eps, threads);
        /* The fused gate/up kernel where it serves the call (the same bits), else the two steps. */
        const fleet_weight_t *gw = &L->gate_up;
        if (gw->fmt != FMT_F32 || gw->input_scale
            || fleet_linear_silu_mul(normed, n, gw->n, gw->k, gw->data, gw->bias, act, threads)) {
            if ((rc = project(gw, normed, n, gu, tmp, threads))) return 100 * (int)(i + 1) + rc;
            fleet_silu_mul_f32(gu, act, n, s->inter, threads);
        }
        if ((rc = project(&L->down, act, n, x, tmp, threads))) return 100 * (int)(i + 1) + rc;
    }
    return 0;
}

/* A packed weight's tiles (kernels/cpu/linear.py's layouts) and their weights decoded into
 * registers, a k (or int4's k pair) at a time: shared by linear.c's register blocks and
 * linear_amx.c's re-laid tiles. */
#ifndef FLEET_TILE_DECODE_H
#define FLEET_TILE_DECODE_H
#include <stdint.h>

#include "linear.h"

#if defined(FLEET_SIMD)
typedef struct {        /* one tile of a packed weight */
    const void *data;   /* the codes or weights of the tile */
    const void *scales, *mins;    /* [K / G][TILE] each: int8's scales float32, int4's scales and mins fp16 */
    int64_t k, group;
    const float *xsum;  /* int4, at most RB / 2 rows: [rows][K / G] sums of x over each group */
    pf_t pf;            /* prefetched beside the k loop (linear.h) */
} tile_t;

AI void bf16_pair(const uint16_t *p, vf w[2]) {
    for (int h = 0; h < 2; h++) w[h] = vf_from_bf16(p + 16 * h);
}

/* 16 channels' int8 weights of one k: the codes times their scales. */
AI vf int8_half(const int8_t *p, vf s) { return vf_mul(vf_from_i8(p), s); }

AI void int8_pair(const int8_t *p, const vf s[2], vf w[2]) {
    for (int h = 0; h < 2; h++) w[h] = int8_half(p + 16 * h, s[h]);
}

/* 16 channels' int4 weights of a k pair from 16 bytes: the even k (low nibbles) and the odd,
 * each code times its scale plus its min. */
AI void int4_half(const uint8_t *p, vf s, vf m, vf *even, vf *odd) {
    vf lo, hi;
    vf_from_nibbles(p, &lo, &hi);
    *even = vf_fmadd(lo, s, m);
    *odd = vf_fmadd(hi, s, m);
}

/* Two k of 32 channels from 32 bytes: w[0..1] the even k (low nibbles), w[2..3] the odd. */
AI void int4_quad(const uint8_t *p, const vf s[2], const vf m[2], vf w[4]) {
    for (int h = 0; h < 2; h++) int4_half(p + 16 * h, s[h], m[h], &w[h], &w[2 + h]);
}

AI void codes8_pair(const int8_t *p, vf w[2]) {
    for (int h = 0; h < 2; h++) w[h] = vf_from_i8(p + 16 * h);
}

AI void load_pair(const float *p, vf v[2]) {
    v[0] = vf_load(p);
    v[1] = vf_load(p + 16);
}

AI void f16_pair(const uint16_t *p, vf v[2]) {
    v[0] = vf_from_f16(p);
    v[1] = vf_from_f16(p + 16);
}

/* Group g's 32 scales into s (int8, int4) and mins into m (int4), as float32. */
AI void group_scales(const int fmt, const tile_t *t, int64_t g, vf s[2], vf m[2]) {
    if (fmt == FMT_INT4) {
        f16_pair((const uint16_t *)t->scales + g * TILE, s);
        f16_pair((const uint16_t *)t->mins + g * TILE, m);
    } else if (fmt == FMT_INT8) {
        load_pair((const float *)t->scales + g * TILE, s);
    }
}

/* The weights of one k (f32, bf16, int8) into w[0..1], or of the k pair at k (int4) into w[0..3]. */
AI void decode(const int fmt, const int pf, const tile_t *t, int64_t k, const vf s[2], const vf m[2], vf *w) {
    if (pf) pf_k(t->pf, k, fmt == FMT_INT4 ? 2 : 1);
    if (fmt == FMT_F32) load_pair((const float *)t->data + k * TILE, w);
    else if (fmt == FMT_BF16) bf16_pair((const uint16_t *)t->data + k * TILE, w);
    else if (fmt == FMT_INT8) int8_pair((const int8_t *)t->data + k * TILE, s, w);
    else if (fmt == FMT_CODES8) codes8_pair((const int8_t *)t->data + k * TILE, w);
    else int4_quad((const uint8_t *)t->data + k / 2 * TILE, s, m, w);
}

AI int64_t tile_bytes(int fmt, int64_t K) {
    static const int64_t bits[FMT_COUNT] = {32, 16, 8, 4};
    return K * TILE * bits[fmt] / 8;
}

/* Tile i of the packed weight: its bytes and scales (int4's two bytes each). */
AI tile_t tile_at(int fmt, const void *data, const void *scales, const void *mins, int64_t K, int64_t G,
                      int64_t i) {
    const int64_t bytes = (G ? K / G : 0) * TILE * (fmt == FMT_INT4 ? 2 : 4);
    tile_t t = {(const char *)data + i * tile_bytes(fmt, K), NULL, NULL, K, G, NULL, {NULL, 0}};
    if (scales) t.scales = (const char *)scales + i * bytes;
    if (mins) t.mins = (const char *)mins + i * bytes;
    return t;
}

#endif
#endif

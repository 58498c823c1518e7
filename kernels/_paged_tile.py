"""The inner step shared by the paged attention kernels: one tile of cached keys.

Keys are addressed per token through the block table, so a tile may span cache blocks and
any block_size works. Scores are kept in the log2 domain (scale_log2 = scale * log2(e)) so
the online softmax uses exp2. Running maxima start at a finite -1e30, not -inf, so a row
that has seen no visible key yet gets alpha = exp2(0) = 1 and p = 0 instead of NaN.
"""

import triton
import triton.language as tl

from kernels._common import mma

NEG_INIT = tl.constexpr(-1.0e30)  # a constexpr: jit code may not read plain globals


@triton.jit
def attend_tile(
    q,  # [BLOCK_M, BLOCK_D] query rows of one kv head group
    acc, m_i, l_i,  # [BLOCK_M, BLOCK_D], [BLOCK_M], [BLOCK_M] float32 running state
    k_cache_ptr, v_cache_ptr,
    block_table_ptr,  # this sequence's row of the block table
    tile_start,  # first key position of the tile
    context_len,  # keys at positions >= context_len are never loaded
    key_limit,  # [BLOCK_M] per row: keys at positions >= key_limit[row] are masked (causal)
    kv_head, scale_log2,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    offs_n = tile_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_context = offs_n < context_len
    d_mask = offs_d < HEAD_DIM
    block_ids = tl.load(block_table_ptr + offs_n // BLOCK_SIZE, mask=in_context, other=0)
    slots = block_ids.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE
    rows = (slots * NUM_KV_HEADS + kv_head) * HEAD_DIM  # [BLOCK_N] element offsets
    k = tl.load(k_cache_ptr + rows[None, :] + offs_d[:, None],
                mask=in_context[None, :] & d_mask[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
    s = mma(q, k, UPCAST, PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
    s = tl.where(offs_n[None, :] < key_limit[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :],
                mask=in_context[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, UPCAST, PRECISION)
    return acc, m_new, l_i

"""Varlen causal attention over the paged cache, for prefill chunks and decode rows alike.

Sequence i owns query rows cu_seqlens_q[i]:cu_seqlens_q[i+1]; they are the LAST q_len
positions of its context of seq_lens[i] tokens, whose K/V (the new chunk's included) are
already in the cache, so a chunk with a cached prefix and a decode row (q_len 1) go through
the same code. A program handles BLOCK_Q query tokens of one sequence and every query head
of one kv head's GQA group: rows are (token, head) pairs, so a decode row still fills
GROUP rows of the dot and each K/V tile is loaded once per group.
"""

import torch
import triton
import triton.language as tl

from kernels._common import (
    FLOAT_DTYPES, INDEX_DTYPES, dot_flags, next_pow2, require, require_kv_cache,
    require_same_device, require_tensor,
)
from kernels._paged_tile import NEG_INIT, attend_tile

BLOCK_M = 64  # (token, head) rows per program
BLOCK_N = 32  # keys per tile


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_q_ptr, seq_lens_ptr, out_ptr,
    scale_log2, q_stride_token, q_stride_head, block_table_stride,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    seq, kv_head, q_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:  # the grid is sized for the longest chunk
        return
    context_len = tl.load(seq_lens_ptr + seq)
    prefix_len = context_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    tokens = q_block * BLOCK_Q + offs_m // GROUP  # index within this sequence's chunk
    heads = kv_head * GROUP + offs_m % GROUP
    row_mask = (offs_m < BLOCK_Q * GROUP) & (tokens < q_len)
    d_mask = offs_d < HEAD_DIM
    token_rows = (q_start + tokens).to(tl.int64)
    q = tl.load(q_ptr + token_rows[:, None] * q_stride_token + heads[:, None] * q_stride_head + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    key_limit = tl.where(row_mask, prefix_len + tokens + 1, 0)  # causal: keys up to own position
    last_token = tl.minimum((q_block + 1) * BLOCK_Q, q_len) - 1
    key_end = prefix_len + last_token + 1  # no row of this block sees a key past this
    table_row = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for tile_start in range(0, key_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table_row, tile_start, key_end, key_limit,
            kv_head, scale_log2, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, UPCAST, PRECISION)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_rows = token_rows * (NUM_HEADS * HEAD_DIM) + heads * HEAD_DIM
    tl.store(out_ptr + out_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    scale: float,
    max_q_len: int,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], dtype of q
    """Causal attention of every query row over its sequence's cached context.

    Contract: seq_lens[i] >= q_len_i (the chunk's own K/V are stored), max_q_len >= every
    q_len_i (a host int, so the launch needs no device sync; rows of a longer chunk would be
    left unwritten). A sequence with q_len 0 is skipped; rows past cu_seqlens_q[-1] (padding)
    are left undefined. q may be a token-strided view (e.g. of a fused qkv output).
    """
    require_tensor("q", q, 3, FLOAT_DTYPES)
    require_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    require_tensor("cu_seqlens_q", cu_seqlens_q, 1, INDEX_DTYPES)
    require_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    require_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                        cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens)
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    require_kv_cache(k_cache, v_cache, q.dtype, head_dim)
    require(num_heads % num_kv_heads == 0, f"num_heads {num_heads} not a multiple of {num_kv_heads}")
    require(cu_seqlens_q.shape[0] == num_seqs + 1 and block_tables.shape[0] == num_seqs,
            "cu_seqlens_q needs num_seqs + 1 entries and block_tables one row per sequence")
    require(isinstance(max_q_len, int) and max_q_len >= 0, "max_q_len must be a non-negative int")
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    group = num_heads // num_kv_heads
    block_m = next_pow2(group, BLOCK_M)
    block_q = block_m // group
    if num_tokens == 0 or num_seqs == 0 or max_q_len == 0:
        return out
    _prefill_kernel[(num_seqs, num_kv_heads, triton.cdiv(max_q_len, block_q))](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=BLOCK_N,
        BLOCK_D=next_pow2(head_dim, 16), **dot_flags(q.dtype, q.device),
    )
    return out

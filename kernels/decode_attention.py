"""Paged decode attention with split-KV (flash-decoding): one query token per sequence.

Stage 1 gives each (sequence, kv head, split) program a contiguous, tile-aligned share of
the context and all query heads of that kv head's GQA group (packed into the rows of one
`tl.dot`); it writes a normalised partial output and its log-sum-exp. Stage 2 merges the
splits. Split boundaries are computed on the device from seq_lens, so nothing is read on
the host and the launch can be captured in a CUDA graph.
"""

import functools

import torch
import triton
import triton.language as tl

from kernels._common import (
    FLOAT_DTYPES, INDEX_DTYPES, dot_flags, next_pow2, require, require_kv_cache,
    require_same_device, require_tensor,
)
from kernels._paged_tile import NEG_INIT, attend_tile

MAX_SPLITS = 32
BLOCK_N = 32  # keys per tile


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, q_stride_seq, q_stride_head, block_table_stride,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    context_len = tl.load(seq_lens_ptr + seq)
    tiles_per_split = tl.cdiv(tl.cdiv(context_len, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g
    head_mask = offs_g < GROUP
    q = tl.load(q_ptr + seq.to(tl.int64) * q_stride_seq + heads[:, None] * q_stride_head + offs_d[None, :],
                mask=head_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], NEG_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    key_limit = tl.full([BLOCK_G], 0, dtype=tl.int32) + end  # every key of the split is visible
    table_row = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for tile_start in range(start, end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table_row, tile_start, end, key_limit,
            kv_head, scale_log2, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, UPCAST, PRECISION)

    # An empty split (short context) reports lse = -inf and a zero partial output.
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    part_row = (seq * NUM_HEADS + heads) * NUM_SPLITS + split  # [BLOCK_G]
    tl.store(part_out_ptr + part_row[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :], out,
             mask=head_mask[:, None])
    tl.store(part_lse_ptr + part_row, lse, mask=head_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    base = (seq * NUM_HEADS + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + offs_s, mask=offs_s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    # An empty context has every lse = -inf: use 0 as the shift so the weights are 0, not NaN.
    weights = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    parts = tl.load(part_out_ptr + (base + offs_s[:, None]).to(tl.int64) * BLOCK_D + offs_d[None, :],
                    mask=offs_s[:, None] < NUM_SPLITS, other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(weights[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)
    out_row = (seq * NUM_HEADS + head).to(tl.int64) * HEAD_DIM
    tl.store(out_ptr + out_row + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: keep the grid small
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_num_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough splits to give every SM about two programs; no more than MAX_SPLITS."""
    return max(1, min(MAX_SPLITS, triton.cdiv(2 * _num_sms(device), max(1, num_seqs * num_kv_heads))))


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new token
    scale: float,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], dtype of q
    """Attention of each sequence's single new query over its first seq_lens[i] cached
    tokens (its own K/V already stored). seq_lens[i] == 0 marks an empty slot: its output
    row is zeros. Block-table entries past a sequence's last block are never read."""
    require_tensor("q", q, 3, FLOAT_DTYPES)
    require_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    require_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    require_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    require_kv_cache(k_cache, v_cache, q.dtype, head_dim)
    require(num_heads % num_kv_heads == 0, f"num_heads {num_heads} not a multiple of {num_kv_heads}")
    require(block_tables.shape[0] == num_seqs and seq_lens.shape[0] == num_seqs, "one row per sequence")
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, q.device)
    require(1 <= num_splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}]")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    block_d = next_pow2(head_dim, 16)
    part_out = torch.empty(num_seqs, num_heads, num_splits, block_d, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, NUM_SPLITS=num_splits, BLOCK_G=next_pow2(num_heads // num_kv_heads, 16), BLOCK_N=BLOCK_N,
        BLOCK_D=block_d, **dot_flags(q.dtype, q.device),
    )
    _decode_reduce_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d,
    )
    return out

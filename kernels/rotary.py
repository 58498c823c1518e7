"""Rotary position embedding (neox / HF rotate_half layout) for q and k in one launch."""

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, INDEX_DTYPES, next_pow2, require, require_same_device, require_tensor


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, token, src_stride_token, src_stride_head, cos, sin,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HALF)
    src = src_ptr + token * src_stride_token + offs_h[:, None] * src_stride_head + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + (token * NUM_HEADS + offs_h[:, None]) * (2 * HALF) + offs_d[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, positions_ptr, cos_sin_ptr, q_out_ptr, k_out_ptr,
    q_stride_token, q_stride_head, k_stride_token, k_stride_head,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(cos_sin_ptr + position * (2 * HALF) + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + position * (2 * HALF) + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, q_out_ptr, token, q_stride_token, q_stride_head, cos[None, :], sin[None, :],
                  NUM_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, k_out_ptr, token, k_stride_token, k_stride_head, cos[None, :], sin[None, :],
                  NUM_KV_HEADS, HALF, BLOCK_HK, BLOCK_HALF)


def rotary_embedding(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, head_dim]: cos in [:, :D/2], sin in [:, D/2:]
) -> tuple[torch.Tensor, torch.Tensor]:  # new contiguous q [T, H, D] and k [T, KVH, D]
    """Rotates the first and second halves of every head: (x1*cos - x2*sin, x2*cos + x1*sin),
    in float32 with one rounding. q and k may be strided views (e.g. of a fused qkv output);
    they are not written. Positions must be < max_positions (not checked: device data)."""
    require_tensor("q", q, 3, FLOAT_DTYPES)
    require_tensor("k", k, 3, FLOAT_DTYPES)
    require_tensor("positions", positions, 1, INDEX_DTYPES)
    require_tensor("cos_sin_cache", cos_sin_cache, 2, FLOAT_DTYPES)
    require_same_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    require(k.shape[0] == num_tokens and k.shape[2] == head_dim, "k must match q in tokens and head_dim")
    require(q.dtype == k.dtype, "q and k dtypes differ")
    require(positions.shape[0] == num_tokens, "one position per token")
    require(head_dim % 2 == 0 and cos_sin_cache.shape[1] == head_dim,
            f"cos_sin_cache width {cos_sin_cache.shape[1]} must equal the (even) head_dim {head_dim}")
    require(cos_sin_cache.is_contiguous(), "cos_sin_cache must be contiguous")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=half,
        BLOCK_HQ=next_pow2(num_heads), BLOCK_HK=next_pow2(num_kv_heads), BLOCK_HALF=next_pow2(half),
    )
    return q_out, k_out

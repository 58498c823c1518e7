"""Write new K/V rows into the paged cache by slot mapping."""

import torch
import triton
import triton.language as tl

from kernels._common import (
    FLOAT_DTYPES, INDEX_DTYPES, next_pow2, require, require_kv_cache, require_same_device,
    require_tensor,
)


@triton.jit
def _store_kvcache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    key_stride, value_stride,  # token strides of key / value (they may be views of a qkv output)
    ROW: tl.constexpr,  # num_kv_heads * head_dim
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding (e.g. in a CUDA-graph batch) writes nothing
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(key_ptr + token.to(tl.int64) * key_stride + offs, mask=mask)
    v = tl.load(value_ptr + token.to(tl.int64) * value_stride + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


def store_kvcache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written in place
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written in place
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (or int32); slot = block_id * block_size + offset
) -> None:
    """k_cache/v_cache at slot_mapping[t] := key/value[t]; a token with a negative slot is
    skipped. Slots must be distinct and < num_blocks * block_size (not checked: that would
    need a device sync). key/value may be token-strided views (e.g. slices of a fused qkv
    output) as long as each token's [num_kv_heads, head_dim] row is contiguous."""
    require_tensor("key", key, 3, FLOAT_DTYPES)
    require_tensor("value", value, 3, FLOAT_DTYPES)
    require_tensor("slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    require_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    require(value.shape == key.shape, f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    require(key.dtype == value.dtype, "key and value dtypes differ")
    require_kv_cache(k_cache, v_cache, key.dtype, head_dim)
    require(k_cache.shape[2] == num_kv_heads, f"cache has {k_cache.shape[2]} kv heads, key has {num_kv_heads}")
    require(slot_mapping.shape[0] == num_tokens, "slot_mapping must have one entry per token")
    for name, t in (("key", key), ("value", value)):
        require(num_tokens == 0 or t.stride(1) == head_dim, f"{name} heads must be densely packed")
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    _store_kvcache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
        ROW=row, BLOCK=next_pow2(row),
    )

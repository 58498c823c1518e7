"""Shared inputs for the kernel tests: the device, random paged caches, assertions."""

import math

import pytest
import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
UNUSED_BLOCK_ID = 1 << 20  # block-table padding: the kernels must never dereference it

# Attention: float32 is exact up to summation order; the half types round P before P @ V.
ATTENTION_TOLERANCES = [
    pytest.param(torch.float32, 1e-5, 1e-5, id="fp32"),
    pytest.param(torch.float16, 3e-3, 3e-3, id="fp16"),
    pytest.param(torch.bfloat16, 2e-2, 2e-2, id="bf16"),
]
# (num_heads, num_kv_heads, head_dim): MHA with a non-power-of-two head count, GQA 3:1 and
# 2:1, a head_dim narrower than a dot tile.
ATTENTION_HEADS = [(3, 3, 32), (9, 3, 16), (6, 3, 64), (4, 2, 8)]


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=DEVICE)


def make_paged_cache(
    context_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
    dtype: torch.dtype, seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache, block_tables [num_seqs, max_blocks] int32, seq_lens int32).

    Each sequence's tokens get random K/V in blocks drawn from a shuffled pool, so blocks
    are not contiguous or in order. Every slot no sequence owns (spare blocks, the tail of a
    partly filled last block) holds NaN: a kernel that reads past a context fails loudly.
    Unused block-table entries hold an id far outside the cache.
    """
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    block_tables = torch.full((len(context_lens), max(blocks_per_seq + [0]) + 1), UNUSED_BLOCK_ID, dtype=torch.int32)
    pool = torch.randperm(num_blocks, generator=g).tolist()
    for i, (context_len, nblocks) in enumerate(zip(context_lens, blocks_per_seq)):
        ids = [pool.pop() for _ in range(nblocks)]
        block_tables[i, :nblocks] = torch.tensor(ids, dtype=torch.int32)
        slots = slots_of(ids, context_len, block_size)
        for cache in (k_cache, v_cache):
            values = torch.randn(context_len, num_kv_heads, head_dim, generator=g)
            cache.view(-1, num_kv_heads, head_dim)[slots] = values.to(dtype)
    seq_lens = torch.tensor(context_lens, dtype=torch.int32)
    return k_cache.to(DEVICE), v_cache.to(DEVICE), block_tables.to(DEVICE), seq_lens.to(DEVICE)


def slots_of(block_ids: list[int], num_tokens: int, block_size: int) -> torch.Tensor:
    """Slot of each of the first num_tokens positions of a sequence owning block_ids."""
    pos = torch.arange(num_tokens)
    return torch.tensor(block_ids, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=False)

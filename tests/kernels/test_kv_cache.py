import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import DEVICE, randn  # noqa: E402
from kernels.kv_cache import store_kvcache  # noqa: E402
from kernels.reference import store_kvcache_ref  # noqa: E402

DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in (torch.float32, torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(3, 16), (1, 64), (2, 24)])
def test_store_matches_reference_and_skips_negative_slots(dtype, num_kv_heads, head_dim):
    num_blocks, block_size = 5, 16
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, seed=1)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, seed=2)
    # Scattered slots, a partly filled block, and two padding tokens (-1) that must not write.
    slots = torch.tensor([17, 3, -1, 79, 40, 41, -1, 0], dtype=torch.int64, device=DEVICE)
    key = randn(len(slots), num_kv_heads, head_dim, dtype=dtype, seed=3)
    value = randn(len(slots), num_kv_heads, head_dim, dtype=dtype, seed=4)
    k_expected, v_expected = store_kvcache_ref(key, value, k_cache, v_cache, slots)
    store_kvcache(key, value, k_cache, v_cache, slots)
    # A copy is exact: compare bit for bit.
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_store_from_fused_qkv_views():
    """key/value sliced out of one [T, (H + 2 * KVH) * D] projection need no copy."""
    tokens, heads, kv_heads, dim = 6, 4, 2, 16
    qkv = randn(tokens, (heads + 2 * kv_heads) * dim, dtype=torch.float32, seed=5)
    key = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    value = qkv[:, (heads + kv_heads) * dim:].view(tokens, kv_heads, dim)
    k_cache = torch.zeros(2, 8, kv_heads, dim, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([15, 2, 3, 9, 10, 0], dtype=torch.int64, device=DEVICE)
    k_expected, v_expected = store_kvcache_ref(key, value, k_cache, v_cache, slots)
    store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_empty_batch_is_a_no_op():
    k_cache = torch.zeros(1, 16, 2, 16, device=DEVICE)
    empty = torch.empty(0, 2, 16, device=DEVICE)
    store_kvcache(empty, empty, k_cache, k_cache.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.all(k_cache == 0)


def test_rejects_misuse():
    k_cache = torch.zeros(2, 16, 2, 16, device=DEVICE)
    key = torch.zeros(3, 2, 16, device=DEVICE)
    slots = torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="dtypes"):
        store_kvcache(key.half(), key.half(), k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="kv heads"):
        one_head = torch.zeros(3, 1, 16, device=DEVICE)
        store_kvcache(one_head, one_head, k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="one entry per token"):
        store_kvcache(key, key, k_cache, k_cache.clone(), slots[:2])
    with pytest.raises(ValueError, match="dtype"):
        store_kvcache(key, key, k_cache, k_cache.clone(), slots.float())

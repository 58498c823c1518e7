import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import (  # noqa: E402
    ATTENTION_HEADS, ATTENTION_TOLERANCES, assert_close, make_paged_cache, randn,
)
from kernels.decode_attention import paged_decode_attention  # noqa: E402
from kernels.reference import paged_decode_attention_ref  # noqa: E402

# Empty slot (0), one token, a partly filled last block, exactly one block, the longest.
CONTEXTS = [0, 1, 21, 16, 70]


@pytest.mark.parametrize("dtype,atol,rtol", ATTENTION_TOLERANCES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", ATTENTION_HEADS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(dtype, atol, rtol, num_heads, num_kv_heads, head_dim, num_splits):
    k_cache, v_cache, block_tables, seq_lens = make_paged_cache(
        CONTEXTS, num_kv_heads, head_dim, block_size=16, dtype=dtype, seed=num_heads * head_dim)
    q = randn(len(CONTEXTS), num_heads, head_dim, dtype=dtype, seed=1)
    scale = head_dim ** -0.5
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=num_splits)
    expected = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
    assert_close(out, expected, atol, rtol)
    assert torch.all(out[0] == 0), "an empty slot must produce zeros, not NaN"


def test_more_splits_than_tiles_and_default_splits():
    """Splits beyond a short context are empty and must not disturb the merge."""
    k_cache, v_cache, block_tables, seq_lens = make_paged_cache([5, 40], 2, 16, 8, torch.float32, seed=3)
    q = randn(2, 4, 16, dtype=torch.float32, seed=4)
    expected = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, 0.25)
    for num_splits in (None, 7):
        out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.25, num_splits=num_splits)
        assert_close(out, expected, 1e-5, 1e-5)


def test_strided_query_view():
    """q sliced out of a fused qkv projection (token stride > heads * head_dim) works."""
    k_cache, v_cache, block_tables, seq_lens = make_paged_cache([9, 33], 1, 16, 16, torch.float32, seed=5)
    qkv = randn(2, 5, 16, dtype=torch.float32, seed=6)
    q = qkv[:, :3]
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.3, num_splits=2)
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, 0.3), 1e-5, 1e-5)


def test_rejects_misuse():
    k_cache, v_cache, block_tables, seq_lens = make_paged_cache([4], 2, 16, 16, torch.float32, seed=7)
    q = randn(1, 4, 16, dtype=torch.float32, seed=8)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(q[:, :3], k_cache, v_cache, block_tables, seq_lens, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(q.half(), k_cache, v_cache, block_tables, seq_lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(q.repeat(1, 1, 2), k_cache, v_cache, block_tables, seq_lens, 1.0)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 1.0, num_splits=0)
    with pytest.raises(ValueError, match="one row per sequence"):
        paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens.repeat(2), 1.0)

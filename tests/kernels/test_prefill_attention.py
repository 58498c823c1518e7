import itertools

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import (  # noqa: E402
    ATTENTION_HEADS, ATTENTION_TOLERANCES, DEVICE, assert_close, make_paged_cache, randn,
)
from kernels.decode_attention import paged_decode_attention  # noqa: E402
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kernels.reference import paged_prefill_attention_ref  # noqa: E402

# (cached prefix, new tokens): a fresh prompt, a chunk after a cached prefix ending inside a
# block, a sequence with nothing scheduled, decode rows, a chunk spanning several blocks.
CHUNKS = [(0, 7), (13, 5), (9, 0), (69, 1), (16, 20), (0, 1)]


def batch(chunks, num_heads, num_kv_heads, head_dim, dtype, seed):
    context_lens = [prefix + q_len for prefix, q_len in chunks]
    k_cache, v_cache, block_tables, seq_lens = make_paged_cache(
        context_lens, num_kv_heads, head_dim, block_size=16, dtype=dtype, seed=seed)
    q_lens = [q_len for _, q_len in chunks]
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE)
    q = randn(int(cu[-1]), num_heads, head_dim, dtype=dtype, seed=seed + 1)
    return q, k_cache, v_cache, block_tables, cu, seq_lens, max(q_lens)


@pytest.mark.parametrize("dtype,atol,rtol", ATTENTION_TOLERANCES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", ATTENTION_HEADS)
def test_prefill_matches_reference(dtype, atol, rtol, num_heads, num_kv_heads, head_dim):
    q, k_cache, v_cache, block_tables, cu, seq_lens, max_q_len = batch(
        CHUNKS, num_heads, num_kv_heads, head_dim, dtype, seed=num_heads + head_dim)
    scale = head_dim ** -0.5
    out = paged_prefill_attention(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, max_q_len)
    expected = paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, cu, seq_lens, scale)
    assert_close(out, expected, atol, rtol)


def test_decode_rows_agree_with_decode_kernel():
    """A mixed batch can run in one prefill launch: its q_len-1 rows equal decode output."""
    chunks = [(30, 1), (0, 12), (47, 1)]
    q, k_cache, v_cache, block_tables, cu, seq_lens, max_q_len = batch(chunks, 6, 2, 32, torch.float32, seed=11)
    out = paged_prefill_attention(q, k_cache, v_cache, block_tables, cu, seq_lens, 0.2, max_q_len)
    decode_rows = torch.tensor([0, 13], device=DEVICE)
    decode_seqs = torch.tensor([0, 2], device=DEVICE)
    decoded = paged_decode_attention(q[decode_rows], k_cache, v_cache, block_tables[decode_seqs],
                                     seq_lens[decode_seqs], 0.2, num_splits=2)
    assert_close(out[decode_rows], decoded, 1e-5, 1e-5)


def test_strided_query_view():
    chunks = [(5, 6), (0, 3)]
    q, k_cache, v_cache, block_tables, cu, seq_lens, max_q_len = batch(chunks, 4, 2, 16, torch.float32, seed=21)
    qkv = torch.cat([q, randn(q.shape[0], 4, 16, dtype=torch.float32, seed=22)], dim=1)
    q_view = qkv[:, :4]
    out = paged_prefill_attention(q_view, k_cache, v_cache, block_tables, cu, seq_lens, 0.25, max_q_len)
    assert_close(out, paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, cu, seq_lens, 0.25), 1e-5, 1e-5)


def test_rejects_misuse():
    q, k_cache, v_cache, block_tables, cu, seq_lens, max_q_len = batch([(0, 3)], 4, 2, 16, torch.float32, seed=31)
    with pytest.raises(ValueError, match="num_seqs \\+ 1"):
        paged_prefill_attention(q, k_cache, v_cache, block_tables, cu[:1], seq_lens, 1.0, max_q_len)
    with pytest.raises(ValueError, match="max_q_len"):
        paged_prefill_attention(q, k_cache, v_cache, block_tables, cu, seq_lens, 1.0, -1)
    with pytest.raises(ValueError, match="dims"):
        paged_prefill_attention(q[0], k_cache, v_cache, block_tables, cu, seq_lens, 1.0, max_q_len)

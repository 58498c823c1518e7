import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import DEVICE, assert_close, randn  # noqa: E402
from kernels.reference import rope_cos_sin_cache, rotary_embedding_ref  # noqa: E402
from kernels.rotary import rotary_embedding  # noqa: E402

TOLERANCES = [
    pytest.param(torch.float32, 1e-5, 1e-5, id="fp32"),
    pytest.param(torch.float16, 2e-3, 2e-3, id="fp16"),
    pytest.param(torch.bfloat16, 2e-2, 2e-2, id="bf16"),
]


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 16), (3, 3, 64), (6, 2, 24)])
def test_rotary_matches_reference(dtype, atol, rtol, num_heads, num_kv_heads, head_dim):
    num_tokens = 7
    q = randn(num_tokens, num_heads, head_dim, dtype=dtype, seed=1)
    k = randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=2)
    positions = torch.tensor([0, 5, 5, 69, 1, 33, 2], dtype=torch.int64, device=DEVICE)
    cache = rope_cos_sin_cache(70, head_dim).to(DEVICE)
    q_out, k_out = rotary_embedding(q, k, positions, cache)
    q_ref, k_ref = rotary_embedding_ref(q, k, positions, cache)
    assert_close(q_out, q_ref, atol, rtol)
    assert_close(k_out, k_ref, atol, rtol)


def test_position_zero_is_identity_and_views_are_not_written():
    heads, kv_heads, dim = 4, 2, 32
    qkv = randn(3, (heads + 2 * kv_heads) * dim, dtype=torch.float32, seed=3)
    before = qkv.clone()
    q = qkv[:, :heads * dim].view(3, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(3, kv_heads, dim)
    positions = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    q_out, k_out = rotary_embedding(q, k, positions, rope_cos_sin_cache(4, dim).to(DEVICE))
    assert torch.equal(q_out, q) and torch.equal(k_out, k) and torch.equal(qkv, before)


def test_rejects_misuse():
    q = randn(2, 4, 16, dtype=torch.float32, seed=4)
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="width"):
        rotary_embedding(q, q, positions, rope_cos_sin_cache(8, 32).to(DEVICE))
    with pytest.raises(ValueError, match="one position per token"):
        rotary_embedding(q, q, positions[:1], rope_cos_sin_cache(8, 16).to(DEVICE))

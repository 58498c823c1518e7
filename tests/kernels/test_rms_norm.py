import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import assert_close, randn  # noqa: E402
from kernels.reference import rmsnorm_ref  # noqa: E402
from kernels.rms_norm import fused_add_rmsnorm, rmsnorm  # noqa: E402

# bfloat16 allows a few units in the last place: the interpreter truncates float32 ->
# bfloat16 where the GPU rounds to nearest, and the kernel rounds three times (sum, normed, out).
TOLERANCES = [
    pytest.param(torch.float32, 1e-5, 1e-5, id="fp32"),
    pytest.param(torch.float16, 2e-3, 2e-3, id="fp16"),
    pytest.param(torch.bfloat16, 3e-2, 2e-2, id="bf16"),
]


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("num_tokens,hidden", [(5, 96), (1, 576), (3, 100)])
def test_fused_add_rmsnorm_matches_reference(dtype, atol, rtol, num_tokens, hidden):
    x = randn(num_tokens, hidden, dtype=dtype, seed=1)
    residual = randn(num_tokens, hidden, dtype=dtype, seed=2)
    weight = randn(hidden, dtype=dtype, seed=3, scale=0.5) + 1
    normed, new_residual = fused_add_rmsnorm(x, residual, weight, 1e-6)
    expected_normed, expected_residual = rmsnorm_ref(x, residual, weight, 1e-6)
    assert_close(new_residual, expected_residual, atol, rtol)
    assert_close(normed, expected_normed, atol, rtol)


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
def test_without_residual_returns_input_as_residual(dtype, atol, rtol):
    x = randn(4, 64, dtype=dtype, seed=4)
    weight = randn(64, dtype=dtype, seed=5)
    normed, new_residual = fused_add_rmsnorm(x, None, weight, 1e-5)
    assert new_residual is x
    assert_close(normed, rmsnorm_ref(x, None, weight, 1e-5)[0], atol, rtol)
    assert_close(rmsnorm(x, weight, 1e-5), normed, 0, 0)


def test_row_strided_input():
    wide = randn(3, 80, dtype=torch.float32, seed=6)
    x = wide[:, :48]
    weight = randn(48, dtype=torch.float32, seed=7)
    assert_close(rmsnorm(x, weight, 1e-6), rmsnorm_ref(x, None, weight, 1e-6)[0], 1e-5, 1e-5)


def test_rejects_misuse():
    x = randn(2, 8, dtype=torch.float32, seed=8)
    with pytest.raises(ValueError, match="weight size"):
        rmsnorm(x, randn(9, dtype=torch.float32, seed=9), 1e-6)
    with pytest.raises(ValueError, match="weight dtype"):
        rmsnorm(x, randn(8, dtype=torch.float16, seed=9), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rmsnorm(x, x[:1], randn(8, dtype=torch.float32, seed=9), 1e-6)

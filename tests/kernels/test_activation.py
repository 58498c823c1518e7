import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import assert_close, randn  # noqa: E402
from kernels.activation import silu_and_mul  # noqa: E402
from kernels.reference import silu_and_mul_ref  # noqa: E402

TOLERANCES = [
    pytest.param(torch.float32, 1e-6, 1e-5, id="fp32"),
    pytest.param(torch.float16, 1e-3, 2e-3, id="fp16"),
    pytest.param(torch.bfloat16, 1e-2, 2e-2, id="bf16"),
]


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("num_tokens,inter", [(5, 77), (1, 1536), (3, 2500)])
def test_silu_and_mul_matches_reference(dtype, atol, rtol, num_tokens, inter):
    x = randn(num_tokens, 2 * inter, dtype=dtype, seed=inter, scale=3.0)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol, rtol)


def test_row_strided_input_and_odd_width_rejected():
    wide = randn(4, 100, dtype=torch.float32, seed=1)
    x = wide[:, :60]
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), 1e-6, 1e-5)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(wide[:, :59])

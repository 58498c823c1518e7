import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from kernel_cases import assert_close, randn  # noqa: E402
from kernels.quant_matmul import int4_matmul, int8_matmul  # noqa: E402
from kernels.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8  # noqa: E402
from kernels.reference import int4_matmul_ref, int8_matmul_ref  # noqa: E402

# Outputs are sums of K products of size ~1 (|out| ~ sqrt(K)); the kernel also rounds each
# dequantized INT4 weight to x's dtype before the dot, which the float32 reference does not.
TOLERANCES = [
    pytest.param(torch.float32, 1e-4, 1e-5, id="fp32"),
    pytest.param(torch.float16, 5e-2, 5e-3, id="fp16"),
    pytest.param(torch.bfloat16, 3e-1, 2e-2, id="bf16"),
]
SHAPES = [(1, 70, 128), (5, 33, 384), (17, 96, 256)]  # (M, N, K): decode row, odd N, M > 16


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_matmul_matches_reference(dtype, atol, rtol, m, n, k):
    qweight, scale = quantize_int8(randn(n, k, dtype=torch.float32, seed=n))
    x = randn(m, k, dtype=dtype, seed=m)
    assert_close(int8_matmul(x, qweight, scale), int8_matmul_ref(x, qweight, scale), atol, rtol)


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_matmul_matches_reference(dtype, atol, rtol, m, n, k, group_size):
    packed, scales, mins = quantize_int4(randn(n, k, dtype=torch.float32, seed=n), group_size)
    x = randn(m, k, dtype=dtype, seed=m)
    out = int4_matmul(x, packed, scales, mins, group_size)
    assert_close(out, int4_matmul_ref(x, packed, scales, mins, group_size), atol, rtol)


@pytest.mark.parametrize("dtype,atol,rtol", TOLERANCES)
@pytest.mark.parametrize("splits,block_k", [(2, 64), (3, 32), (5, 64)])
def test_split_k_matches_reference(dtype, atol, rtol, splits, block_k):
    """Split-K partial sums (the few-rows path on a GPU), K ranges of uneven length, a K that
    BLOCK_K does not divide (INT4: groups of 32 over K = 352)."""
    m, n, k = 3, 40, 352
    config = {"splits": splits, "block_k": block_k}
    qweight, scale = quantize_int8(randn(n, k, dtype=torch.float32, seed=7))
    x = randn(m, k, dtype=dtype, seed=8)
    assert_close(int8_matmul(x, qweight, scale, config=config), int8_matmul_ref(x, qweight, scale), atol, rtol)
    packed, scales, mins = quantize_int4(randn(n, k, dtype=torch.float32, seed=9), 32)
    assert_close(int4_matmul(x, packed, scales, mins, 32, config=config),
                 int4_matmul_ref(x, packed, scales, mins, 32), atol, rtol)


def test_few_rows_split_k_and_many_rows_do_not():
    from kernels.quant_matmul import _splits

    assert _splits(1, 6144, 4096, 16, 32, 64) == 4          # 192 tiles -> 768 programs
    assert _splits(1, 4096, 14336, 16, 32, 64) == 8
    assert _splits(1, 28672, 4096, 16, 32, 64) == 1         # 896 tiles already
    assert _splits(2048, 4096, 4096, 64, 64, 64) == 1       # prefill
    assert _splits(1, 70, 128, 16, 32, 64) == 1             # K too short to split


def test_quantization_error_is_bounded():
    """Round-to-nearest: each weight is within half a quantization step of the original."""
    w = randn(40, 256, dtype=torch.float32, seed=1)
    w[3] = 0.0  # an all-zero row and a constant group must not produce NaN
    w[4, :128] = 0.7
    qweight, scale = quantize_int8(w)
    assert torch.all((dequantize_int8(qweight, scale) - w).abs() <= scale[:, None] / 2 + 1e-6)
    packed, scales, mins = quantize_int4(w, 128)
    step = scales.repeat_interleave(128, dim=1)
    assert torch.all((dequantize_int4(packed, scales, mins, 128) - w).abs() <= step / 2 + 1e-6)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (40, 128)


def test_row_strided_activations():
    qweight, scale = quantize_int8(randn(24, 64, dtype=torch.float32, seed=2))
    x = randn(3, 100, dtype=torch.float32, seed=3)[:, :64]
    assert_close(int8_matmul(x, qweight, scale), int8_matmul_ref(x, qweight, scale), 1e-4, 1e-5)


def test_rejects_misuse():
    w = randn(8, 96, dtype=torch.float32, seed=4)
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_int4(w, 64)
    with pytest.raises(ValueError, match="power of two"):
        quantize_int4(w, 48)
    packed, scales, mins = quantize_int4(w, 32)
    x = randn(2, 96, dtype=torch.float32, seed=5)
    with pytest.raises(ValueError, match="multiple of group_size"):
        int4_matmul(x, packed, scales, mins, 64)
    with pytest.raises(ValueError, match="scales"):
        int4_matmul(x, packed, scales[:, :2].contiguous(), mins, 32)
    qweight, scale = quantize_int8(w)
    with pytest.raises(ValueError, match="qweight"):
        int8_matmul(x[:, :64], qweight, scale)
    with pytest.raises(ValueError, match="scale"):
        int8_matmul(x, qweight, scale.half())

"""The fused gate/up projection and activation (linear.c's fleet_linear_silu_mul through
kernels.cpu.linear.linear_silu_mul and the ``cpu`` backend's gated_mlp): the same bits as the
projection followed by the backend's silu_and_mul, wherever it serves a call, and None (the
caller's two steps) wherever it does not."""
import pytest
import torch

from gpu_worker.model.ops import cpu_ops
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from kernels.cpu import linear as L
from kernels.cpu import process_kernels

needs_avx512 = pytest.mark.skipif(process_kernels() is None or process_kernels().simd != "avx512",
                                  reason="the fused kernel needs the AVX-512 build")


def _two_steps(x: torch.Tensor, w: L.PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    return cpu_ops.silu_and_mul(L.linear(x, w, bias))


@needs_avx512
@pytest.mark.parametrize("rows", [9, 12, 13, 48, 49, 300])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("pairs", [False, True])
def test_fused_gate_up_is_the_same_bits_as_the_two_steps(rows, with_bias, pairs):
    """Both ways past 48 rows (the f32 pairs tuning, on by default on Intel only): each fused
    path gives the bits of the two steps under the same tuning."""
    gen = torch.Generator().manual_seed(rows)
    inter, k = 96, 80
    w = L.pack_f32(torch.randn(2 * inter, k, generator=gen))
    bias = torch.randn(2 * inter, generator=gen) if with_bias else None
    x = torch.randn(rows, k, generator=gen) * 3
    previous = L.tuning()
    try:
        assert L.tuning(f32_pairs=pairs)["f32_pairs"] is pairs
        fused = L.linear_silu_mul(x, w, bias)
        assert fused is not None and fused.shape == (rows, inter)
        assert torch.equal(fused, _two_steps(x, w, bias))
    finally:
        L.tuning(**previous)


@pytest.mark.parametrize("rows,n,fmt", [(8, 128, "f32"), (1, 128, "f32"), (16, 96, "f32"), (16, 128, "bf16")])
def test_calls_the_fused_kernel_does_not_serve_return_none(rows, n, fmt):
    """8 rows or fewer, N / 2 not a multiple of 32, or a weight other than f32."""
    w = torch.randn(n, 64)
    packed = L.pack_f32(w) if fmt == "f32" else L.pack_bf16(w)
    assert L.linear_silu_mul(torch.randn(rows, 64), packed) is None


@needs_avx512
def test_gated_mlp_fuses_a_packed_projection_and_keeps_hooks_observing():
    gen = torch.Generator().manual_seed(1)
    proj = CpuPackedLinear.dense(torch.randn(256, 64, generator=gen), "f32")
    x = torch.randn(20, 64, generator=gen)
    expected = cpu_ops.silu_and_mul(proj(x))
    assert torch.equal(cpu_ops.gated_mlp(proj, x), expected)
    seen = []
    handle = proj.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))
    try:
        assert torch.equal(cpu_ops.gated_mlp(proj, x), expected)
    finally:
        handle.remove()
    assert seen == [(20, 64)]   # a hooked projection is called, not bypassed

"""INT4's scales and minima are fp16 values (kernels.quantize.half_grid): the CPU kernels hold
them in two bytes each, so every quantizer gives values fp16 holds exactly, and the packed
tiles carry them unchanged."""
import pytest
import torch

from kernels.cpu import linear as L
from kernels.quantize import HALF_TINY, dequantize_int4, half_grid, quantize_int4


def _exact(t: torch.Tensor) -> bool:
    return torch.equal(t.half().float(), t)


def test_min_max_quantization_keeps_every_weight_within_half_a_step_on_the_fp16_grid():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(24, 256, generator=gen) * torch.logspace(-6, 3, 24)[:, None]   # tiny to loud rows
    w[2] = 0.0                       # all zero
    w[3, :64] = 0.7                  # constant, and not an fp16 value
    w[4, :64] = -1234.567            # constant, loud
    w[5, 64:128] = torch.linspace(-1e-7, 1e-7, 64)   # a range below fp16's normals
    packed, scales, mins = quantize_int4(w, 64)
    assert _exact(scales) and _exact(mins) and bool((scales > 0).all())
    step = scales.repeat_interleave(64, dim=1)
    err = (dequantize_int4(packed, scales, mins, 64) - w).abs()
    assert bool((err <= step / 2 * (1 + 1e-6)).all()), (err - step / 2).max()


def test_to_nearest_for_fitted_grids_and_exact_values_unchanged():
    s = torch.tensor([[0.1, 3e-9, 1e-3, 0.0]])
    m = torch.tensor([[-0.7, 5e-8, -65504.0, 2.0]])
    hs, hm = half_grid(s, m)
    assert torch.equal(hs, torch.tensor([[0.1, HALF_TINY, 1e-3, 0.0]]).half().float())   # positive stays positive
    assert torch.equal(hm, m.half().float())
    assert [torch.equal(a, b) for a, b in zip(half_grid(hs, hm), (hs, hm))] == [True, True]


@pytest.mark.parametrize("bad", [7e4, -1e6, float("inf"), float("nan")])
def test_values_beyond_fp16_are_refused_not_saturated(bad):
    with pytest.raises(ValueError, match="fp16"):
        half_grid(torch.tensor([[bad]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="fp16"):
        half_grid(torch.ones(1, 1), torch.tensor([[bad]]))
    w = torch.zeros(4, 64)
    w[1, 3] = bad if bad == bad else 1.0
    w[1, 5] = -abs(bad) if bad == bad else float("nan")
    with pytest.raises(ValueError, match="fp16"):
        quantize_int4(w, 32)
    with pytest.raises(ValueError, match="fp16"):
        L.pack_int4(torch.zeros(4, 32, dtype=torch.uint8), torch.full((4, 2), bad), torch.zeros(4, 2), 32)


def test_packed_tiles_hold_fp16_and_round_other_values_to_nearest():
    gen = torch.Generator().manual_seed(4)
    packed, scales, mins = quantize_int4(torch.randn(40, 128, generator=gen), 32)
    w = L.pack_int4(packed, scales, mins, 32)
    assert w.scales.dtype == w.mins.dtype == torch.float16
    assert torch.equal(L.dequantize(w), dequantize_int4(packed, scales, mins, 32))
    fine_s, fine_m = scales * (1 + 1e-4), mins + 1e-5      # finer than fp16, as a checkpoint from before
    w = L.pack_int4(packed, fine_s, fine_m, 32)
    assert torch.equal(L.dequantize(w), dequantize_int4(packed, fine_s.half(), fine_m.half(), 32))

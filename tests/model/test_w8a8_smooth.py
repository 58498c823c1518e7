"""Smoothed W8A8 (quant/smooth.py): the smoothing scales cut the error of the whole W8A8
product where activations have loud channels, the serving kernels compute what the search
measured, and ``--quantization w8a8`` calibrates once, then loads from the cache."""
import pytest
import torch

from gpu_worker import LLM
from gpu_worker.bench.quant_quality import forward_logits
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.quant.calibration import LayerInputs
from gpu_worker.model.quant.smooth import smoothed_int8, w8a8_output
from kernels.cpu import linear as packed_linear


def _rows(n: int, loud: torch.Tensor) -> torch.Tensor:
    return torch.randn(n, loud.numel()) * loud


def test_smoothing_cuts_the_w8a8_error_on_unseen_rows():
    """Inputs with a few loud channels (as LLM activations have): per-row int8 rounding
    leaves the quiet channels a coarse grid unless the loud ones are moved into the weights."""
    torch.manual_seed(0)
    w = torch.randn(192, 256) * 0.05
    loud = torch.ones(256)
    loud[torch.randperm(256)[:6]] = 40.0
    q, scale, s, alpha = smoothed_int8(w, LayerInputs.from_rows(_rows(512, loud)))
    assert alpha > 0 and q.dtype == torch.int8 and scale.shape == (192,) and s.shape == (256,)
    x = _rows(512, loud)
    plain = (w8a8_output(x, w, torch.ones(256)) - x @ w.t()).norm()
    smoothed = (w8a8_output(x, w, s) - x @ w.t()).norm()
    assert smoothed < 0.5 * plain
    assert torch.equal(q.float() * scale[:, None], packed_linear.dequantize(packed_linear.pack_w8a8(q, scale)))


def test_without_loud_channels_nothing_is_moved():
    torch.manual_seed(1)
    w = torch.randn(64, 128) * 0.05
    x = torch.randn(256, 128)
    *_, s, alpha = smoothed_int8(w, LayerInputs.from_rows(x))
    plain = (w8a8_output(x, w, torch.ones(128)) - x @ w.t()).norm()
    assert (w8a8_output(x, w, s) - x @ w.t()).norm() <= plain     # never worse on the calibration rows
    assert alpha == 0 or alpha <= 0.6


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_the_packed_module_computes_what_the_search_measured(rows):
    torch.manual_seed(rows)
    w = torch.randn(70, 96) * 0.05             # N not a multiple of the 32-channel tile
    loud = torch.ones(96)
    loud[:3] = 25.0
    q, scale, s, _ = smoothed_int8(w, LayerInputs.from_rows(_rows(128, loud)))
    lin = CpuPackedLinear(packed_linear.pack_w8a8(q, scale), None, s)
    x = _rows(rows, loud)
    torch.testing.assert_close(lin(x), w8a8_output(x, w, s), rtol=1e-4, atol=1e-4)


def test_w8a8_is_calibrated_once_then_loaded_from_the_cache(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    ids = list(range(200, 230))
    first = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="w8a8").engine.model
    entries = list((tmp_path / "quantized").iterdir())
    assert len(entries) == 1 and "w8a8" in entries[0].name
    projections = [m for layer in first.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    assert all(m.input_scale is not None for m in projections)
    if packed_linear.w8a8_supported():
        assert all(isinstance(m, CpuPackedLinear) and m.fmt == "w8a8" for m in projections)
    second = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="w8a8+head").engine.model   # same entry
    assert len(list((tmp_path / "quantized").iterdir())) == 1
    assert torch.equal(first.layers[1].down(torch.ones(3, first.cfg.intermediate_size)),
                       second.layers[1].down(torch.ones(3, first.cfg.intermediate_size)))
    assert second.packed_head.input_scale is not None       # the head's smoothing came from the cache too
    # calibrated in one go (no cache): the same head and logits
    fresh = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="w8a8+head", quant_cache=False).engine.model
    assert torch.equal(fresh.packed_head.input_scale, second.packed_head.input_scale)
    assert torch.equal(forward_logits(fresh, ids), forward_logits(second, ids))
    LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int8")      # weight-only int8: no entry
    assert len(list((tmp_path / "quantized").iterdir())) == 1

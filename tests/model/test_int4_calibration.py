"""Calibrated INT4: the weighted group fit, GPTQ, the calibration statistics and text, and
the cache that makes calibration a one-time cost."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.bench.quant_quality import forward_logits
from gpu_worker.model.quant.calibration import LayerInputs, greedy_replies, layer_inputs
from gpu_worker.model.quant.gptq import gptq_int4
from gpu_worker.model.quant.int4_fit import fit_int4
from gpu_worker.model.quant.quantize import Int4Linear, _projections
from kernels.quantize import dequantize_int4, unpack_int4


def _correlated_rows(n: int, k: int, seed: int) -> torch.Tensor:
    """Rows with a few loud channels and strongly correlated features, as real activations."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=torch.Generator().manual_seed(99)) / k ** 0.5 + torch.eye(k)
    loud = torch.ones(k)
    loud[::17] = 6.0
    return (torch.randn(n, k, generator=g) @ mix) * loud


def test_weighted_fit_trades_error_on_quiet_inputs_for_loud_ones():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    importance = torch.ones(128)
    importance[::8] = 100.0
    plain = dequantize_int4(*fit_int4(w, 64), 64)
    weighted = dequantize_int4(*fit_int4(w, 64, importance), 64)

    def weighted_err(w_hat):
        return ((w - w_hat).pow(2) * importance).sum()

    assert weighted_err(weighted) < 0.7 * weighted_err(plain)
    assert (w - weighted).pow(2).sum() > (w - plain).pow(2).sum()   # it is a trade, not a free lunch


def test_gptq_cuts_the_output_error_on_unseen_rows_and_keeps_the_format():
    torch.manual_seed(0)
    k, g = 256, 64
    w = torch.randn(96, k) * 0.05
    h = LayerInputs.from_rows(_correlated_rows(4096, k, seed=1)).second_moment
    packed, scales, mins = gptq_int4(w, h, g)
    assert packed.dtype == torch.uint8 and packed.shape == (96, k // 2)
    assert scales.shape == mins.shape == (96, k // g)
    codes = unpack_int4(packed)
    assert codes.min() >= 0 and codes.max() <= 15
    x = _correlated_rows(2048, k, seed=2)           # rows GPTQ never saw
    ref = x @ w.t()
    gptq_err = (x @ dequantize_int4(packed, scales, mins, g).t() - ref).norm()
    fit_err = (x @ dequantize_int4(*fit_int4(w, g), g).t() - ref).norm()
    assert gptq_err < 0.8 * fit_err


def test_gptq_ignores_inputs_that_never_fire():
    w = torch.randn(8, 32)
    x = torch.randn(100, 32)
    x[:, 5] = 0.0
    packed, scales, mins = gptq_int4(w, LayerInputs.from_rows(x).second_moment, 16)
    assert torch.isfinite(scales).all() and torch.isfinite(mins).all()


def test_layer_inputs_statistics_cover_every_row(tiny_llama_dir):
    model = LLM(tiny_llama_dir, kv_cache_memory=8 << 20).engine.model
    target = model.layers[1].down
    seqs = [list(range(100, 160)), list(range(300, 337))]
    rows = []
    handle = target.register_forward_hook(lambda m, a, o: rows.append(a[0].reshape(-1, a[0].shape[-1])))
    try:
        stats = layer_inputs(model, seqs, lambda m: m is target, max_rows=32)[target]
    finally:
        handle.remove()
    x = torch.cat(rows)
    assert x.shape[0] == 97 and stats.sample.shape == (32, x.shape[1])
    torch.testing.assert_close(stats.second_moment, x.t() @ x / 97, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats.abs_mean, x.abs().mean(0))


def test_greedy_replies_match_the_engine(tiny_qwen_dir):
    llm = LLM(tiny_qwen_dir, kv_cache_memory=8 << 20)
    prompts = [list(range(200, 223)), list(range(400, 405)), list(range(600, 640))]
    expected = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12,
                                                                          ignore_eos=True))]
    assert greedy_replies(llm.engine.model, prompts, 12) == expected


def test_int4_calibrated_once_then_loaded_from_the_cache(tiny_llama_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    ids = list(range(200, 230))
    first = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4").engine.model
    cached = list((tmp_path / "quantized").iterdir())
    assert len(cached) == 1 and (cached[0] / "quantized.safetensors").exists()
    assert all(isinstance(m, Int4Linear) and m.input_scale is not None for _, _, m in _projections(first))
    with caplog.at_level("INFO", logger="gpu_worker.model.quant.cache"):
        second = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4").engine.model
    assert "loaded from the cache" in caplog.text
    assert torch.equal(forward_logits(first, ids), forward_logits(second, ids))
    LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4-g32")      # int4's own group: its entry
    assert len(list((tmp_path / "quantized").iterdir())) == 1
    LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4-g64")      # another spec: another entry
    assert len(list((tmp_path / "quantized").iterdir())) == 2
    # fewer positions cut the calibration text shorter: another entry too
    LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4", max_model_len=64)
    assert len(list((tmp_path / "quantized").iterdir())) == 3


def test_quant_cache_can_be_turned_off(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4", quant_cache=False)
    assert not (tmp_path / "quantized").exists()


@pytest.mark.parametrize("spec", ["int8", "int4"])
def test_quantized_model_still_serves_a_batch(tiny_qwen_dir, tmp_path, monkeypatch, spec):
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    llm = LLM(tiny_qwen_dir, kv_cache_memory=8 << 20, quantization=spec)
    outs = llm.generate([list(range(100, 120)), list(range(50, 53))], SamplingParams(temperature=0, max_tokens=5))
    assert [len(o.token_ids) for o in outs] == [5, 5]


def test_fleet_quantize_fills_the_cache_workers_then_load(tiny_llama_dir, tmp_path, monkeypatch, capsys, caplog):
    from producer.cli import main

    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    assert main(["quantize", "--model", str(tiny_llama_dir)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith(str(tmp_path / "quantized")) and (tmp_path / "quantized").exists()
    with caplog.at_level("INFO", logger="gpu_worker.model.quant.cache"):
        LLM(tiny_llama_dir, kv_cache_memory=8 << 20, quantization="int4")
    assert "loaded from the cache" in caplog.text


def test_calibration_fits_a_short_context(tmp_path, monkeypatch):
    """A model with fewer positions than the calibration text: replies and exchanges are cut
    to fit, and quantization still works."""
    from gpu_worker.model.quant.calibration import calibration_sequences
    from gpu_worker.testing import make_tiny_model

    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    short = make_tiny_model(tmp_path / "short", "llama", max_position_embeddings=96)
    llm = LLM(short, kv_cache_memory=8 << 20)
    seqs = calibration_sequences(llm.tokenizer, llm.engine.model)
    assert seqs and max(map(len, seqs)) <= 96
    LLM(short, kv_cache_memory=8 << 20, quantization="int4")

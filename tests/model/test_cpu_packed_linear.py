"""The packed-weight CPU projections (ops/cpu_linear.py, quant/cpu_pack.py): the module
computes what its dequantized weight does, a tiny model quantized or with bf16 weights
generates through the engine the same greedy tokens as the dequantize-then-F.linear
reference, the calibrated cache round trip packs to the same outputs, and a CPU without
the kernels keeps the previous path and says so."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.bench.quant_quality import forward_logits
from gpu_worker.model.ops import cpu_linear
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.quant.checkpoint import load_quantized, save_quantized
from gpu_worker.model.quant.cpu_pack import pack_quantized
from gpu_worker.model.quant.quantize import Int8Linear, quantize_model, weight_bytes
from gpu_worker.testing import make_tiny_model
from kernels import cpuinfo
from kernels.cpu import greedy_head
from kernels.cpu import linear as packed_linear
from kernels.quantize import quantize_int4, quantize_int8

PROMPTS = [[5, 6, 7, 8, 100, 2000], list(range(300, 340)), [42] * 3]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Hidden size 128: every projection has at least two groups of 64 (int4 packs them all)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-128"), "llama", seed=3, hidden_size=128)


def _weight(fmt: str, n: int, k: int) -> packed_linear.PackedWeight:
    w = torch.randn(n, k) * 0.05
    if fmt in ("f32", "bf16"):
        return {"f32": packed_linear.pack_f32, "bf16": packed_linear.pack_bf16}[fmt](w)
    if fmt.startswith("int8"):
        return packed_linear.pack_int8(*quantize_int8(w, 32 if fmt == "int8-g32" else None))
    return packed_linear.pack_int4(*quantize_int4(w, 32), 32)


@pytest.mark.parametrize("fmt", ["f32", "bf16", "int8", "int8-g32", "int4-g32"])
@pytest.mark.parametrize("rows", [0, 1, 3, 9, 40])
def test_module_matches_its_dequantized_weight(fmt, rows):
    torch.manual_seed(rows)
    n, k = 70, 96                      # N not a multiple of the 32-channel tile
    w = _weight(fmt, n, k)
    bias = torch.randn(n)
    scale = torch.rand(k) + 0.5 if fmt == "int4-g32" else None
    lin = CpuPackedLinear(w, bias, scale)
    x = torch.randn(rows, k)
    want = packed_linear.reference_linear(x if scale is None else x / scale, w, bias)
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.weight, packed_linear.dequantize(w) / (1 if scale is None else scale))
    strided = torch.randn(rows, 2, k)[:, 1]
    want = packed_linear.reference_linear(strided if scale is None else strided / scale, w, bias)
    torch.testing.assert_close(lin(strided), want, rtol=1e-4, atol=1e-4)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("options", [{"quantization": "int8"}, {"quantization": "int8-g64"},
                                     {"quantization": "int4-g64"}, {"quantization": "int8+head"},
                                     {"quantization": "w8a8"}, {"dtype": "bfloat16"}])
def test_packed_model_generates_as_the_reference_path(tiny_dir, options, monkeypatch):
    if options.get("quantization") == "w8a8" and not packed_linear.w8a8_supported():
        pytest.skip("no W8A8 kernel (AVX512_VNNI or AVX2): w8a8 serves the int8 weight-only kernel")
    llm = LLM(tiny_dir, kv_cache_memory=8 << 20, quant_cache=False, **options)
    model = llm.engine.model
    fmt = options.get("quantization", "bf16")[:4]
    projections = [m for layer in model.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    assert all(isinstance(m, CpuPackedLinear) and m.fmt == fmt for m in projections)
    # a quantized model's float head: the f32 kernels' packed copy
    head_fmt = "bf16" if "dtype" in options else "int8" if options["quantization"].endswith("+head") else "f32"
    assert isinstance(model.packed_head, CpuPackedLinear) and model.packed_head.fmt == head_fmt
    packed = _greedy(llm)
    assert model.fused_decode is not None      # decode steps in one C call (ops/cpu_fused.py) ...
    monkeypatch.setattr(model, "fused_decode", None)   # ... the reference runs every step op by op
    monkeypatch.setattr(packed_linear, "linear", lambda x, w, bias=None: packed_linear.reference_linear(x, w, bias))
    monkeypatch.setattr(packed_linear, "linear_w8a8", lambda x, w, bias=None: packed_linear.reference_w8a8(x, w, bias))
    assert _greedy(llm) == packed
    if "dtype" in options:             # only the matmul weights are bf16
        assert model.norm.dtype == model.embed.dtype == torch.float32
        assert all(k.dtype == torch.float32 for k, _ in llm.engine.runner.kv_caches)


def test_lm_head_switch_and_its_bytes(tiny_dir):
    by_spec = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8+head").engine.model
    by_field = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8", quantize_lm_head=True).engine.model
    float_head = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8").engine.model
    h = torch.randn(5, by_spec.cfg.hidden_size)
    assert torch.equal(by_spec.compute_logits(h), by_field.compute_logits(h))
    vocab, hidden = by_spec.lm_head.shape
    assert weight_bytes(by_spec)["packed_head_bytes"] == vocab * (hidden + 4)     # int8 codes, fp32 scales
    assert weight_bytes(float_head)["packed_head_bytes"] == vocab * hidden * 4     # oneDNN's fp32 copy
    rel = (by_spec.compute_logits(h) - float_head.compute_logits(h)).norm() / float_head.compute_logits(h).norm()
    assert 0 < rel < 0.02


def test_calibrated_cache_round_trip_packs_to_the_same_outputs(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path))
    ids = list(range(200, 230))
    first = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int4-g64").engine.model
    second = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int4-g64+head").engine.model   # same entry
    assert len(list((tmp_path / "quantized").iterdir())) == 1
    assert isinstance(second.layers[0].qkv, CpuPackedLinear) and second.layers[0].qkv.input_scale is not None
    assert torch.equal(first.layers[1].down(torch.ones(3, 384)), second.layers[1].down(torch.ones(3, 384)))
    # by hand: quantize, save, load, pack
    a = LLM(tiny_dir, kv_cache_memory=8 << 20, onednn=False).engine.model
    quantize_model(a, "int8-g64")
    save_quantized(a, "int8-g64", tmp_path / "ckpt")
    b = LLM(tiny_dir, kv_cache_memory=8 << 20, onednn=False).engine.model
    assert load_quantized(b, tmp_path / "ckpt") == "int8-g64"
    canonical = forward_logits(a, ids)
    assert pack_quantized(a) == pack_quantized(b) == 4 * len(a.layers)
    assert torch.equal(forward_logits(a, ids), forward_logits(b, ids))
    torch.testing.assert_close(forward_logits(a, ids), canonical, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="before packing"):
        save_quantized(a, "int8-g64", tmp_path / "again")


def test_without_the_kernels_the_dequantizing_path_stays_and_the_log_says_so(tiny_dir, monkeypatch, caplog):
    monkeypatch.setattr(packed_linear, "supported", lambda fmt: False)
    monkeypatch.setattr(cpu_linear, "_reported", set())
    with caplog.at_level("WARNING", logger="gpu_worker.model.ops.cpu_linear"):
        int8 = LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8").engine.model
        bf16 = LLM(tiny_dir, kv_cache_memory=8 << 20, dtype="bfloat16").engine.model
    assert isinstance(int8.layers[0].qkv, Int8Linear)
    assert not any(isinstance(m, CpuPackedLinear) for m in bf16.modules()) and bf16.norm.dtype == torch.float32
    assert "packed int8 weights: the kernel does not run here" in caplog.text
    assert "packed bf16 weights" in caplog.text and "serving float32 weights instead" in caplog.text
    assert caplog.text.count("packed int8 weights") == 1


def test_the_log_says_what_computes_each_packed_format(tiny_dir, monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "_described", set())
    with caplog.at_level("INFO", logger="gpu_worker.model.ops.cpu_linear"):
        LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8")
        LLM(tiny_dir, kv_cache_memory=8 << 20, quantization="int8")
    line = f"CPU matmuls over int8 weights: {packed_linear.instructions('int8')}"
    assert caplog.text.count(line) == 1                    # once per format and process
    assert "CPU matmuls over f32 weights" in caplog.text   # the LM head stays float


@pytest.mark.parametrize("mode, vendor, amx, rows", [
    (None, "AuthenticAMD", False, cpu_linear.AVX2_SCREEN_ROWS),          # AVX2: the int8 screen only
    ("native", "AuthenticAMD", False, cpu_linear.FAST_BF16_INT8_ROWS),  # AMD's full-rate vdpbf16ps
    ("native", "GenuineIntel", False, greedy_head.INT8_ROWS),
    ("native", "AuthenticAMD", True, greedy_head.INT8_ROWS),             # the bf16 pass on AMX tiles
    ("widened", "AuthenticAMD", False, greedy_head.INT8_ROWS),
])
def test_the_greedy_heads_int8_limit_follows_the_cpu(mode, vendor, amx, rows, monkeypatch):
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(greedy_head, "on_amx", lambda k: amx)
    assert cpu_linear.screen_int8_rows(mode, 576) == rows


def test_cpu_vendor_and_flags_read_proc_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                    "flags\t\t: fpu avx2 avx512f\n\n"
                    "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2\n")
    monkeypatch.setattr(cpuinfo, "CPUINFO", info)
    assert cpu_linear.cpu_vendor() == "AuthenticAMD"                  # the first CPU's block only
    assert cpu_linear.cpu_flags() == {"fpu", "avx2", "avx512f"}
    assert cpuinfo.model_name() == "AMD EPYC 9R14"
    info.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")   # Arm names its flags so
    assert cpuinfo.flags() == {"fp", "asimd", "sve"} and cpuinfo.vendor() == ""
    assert cpuinfo.model_name()                                      # platform's name instead
    monkeypatch.setattr(cpuinfo, "CPUINFO", tmp_path / "missing")
    assert cpu_linear.cpu_vendor() == "" and cpu_linear.cpu_flags() == set() and cpuinfo.first_cpu() == {}

"""oneDNN-packed linears (the CPU path): same results as F.linear up to float32 rounding,
one switch to turn them off, and they survive copying and quantization of a packed model."""
import copy

import pytest
import torch
import torch.nn.functional as F

from gpu_worker import LLM, SamplingParams
from gpu_worker.model.ops import onednn
from gpu_worker.model.ops.base import Linear
from gpu_worker.model.quant.quantize import Int8Linear, quantize_model, weight_bytes

pytestmark = pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [0, 1, 3, 17, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias):
    torch.manual_seed(rows)
    w, b = torch.randn(96, 80), (torch.randn(96) if bias else None)
    lin = onednn.PackedLinear(w, b)
    x = torch.randn(rows, 80)
    torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    assert torch.equal(lin.weight, w)       # unpacking is exact
    strided = torch.randn(rows, 2, 80)[:, 1]
    torch.testing.assert_close(lin(strided), F.linear(strided, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not onednn.packable(torch.bfloat16),
                    reason="this CPU has no bfloat16 oneDNN path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
def test_bfloat16_packs_too():
    w = torch.randn(64, 48).bfloat16()
    x = torch.randn(5, 48).bfloat16()
    torch.testing.assert_close(onednn.PackedLinear(w)(x).float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_engine_model_is_packed_and_the_switch_turns_it_off(tiny_llama_dir, backend):
    """oneDNN packs the torch backend's model; the cpu backend's goes to the packed f32
    kernels where they run (``model/build.py``), else to oneDNN too."""
    from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
    from kernels.cpu import linear as packed_linear

    packed = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, ops_backend=backend).engine.model
    assert all(not isinstance(m, Linear) for m in packed.modules())
    own = backend == "cpu" and packed_linear.supported("f32")
    assert isinstance(packed.layers[0].qkv, CpuPackedLinear if own else onednn.PackedLinear)
    assert packed.packed_head is not None
    plain = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, onednn=False, ops_backend=backend).engine.model
    assert type(plain.layers[0].qkv) is Linear and plain.packed_head is None
    h = torch.randn(7, plain.cfg.hidden_size)
    torch.testing.assert_close(packed.compute_logits(h), plain.compute_logits(h), rtol=1e-5, atol=1e-4)
    x = torch.randn(7, plain.cfg.hidden_size)
    torch.testing.assert_close(packed.layers[1].gate_up(x), plain.layers[1].gate_up(x), rtol=1e-5, atol=1e-4)
    # the packed head is an extra copy of the tied embedding, and it is counted
    assert weight_bytes(packed)["packed_head_bytes"] == plain.embed.numel() * 4
    assert weight_bytes(plain)["packed_head_bytes"] == 0


def test_packed_model_copies_and_quantizes(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=8 << 20)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = llm.generate([[5, 6, 7, 8]], params)[0].token_ids
    model = llm.engine.model
    clone = copy.deepcopy(model)
    quantize_model(clone, "int8")
    assert isinstance(clone.layers[0].qkv, Int8Linear)
    packed_type = type(model.layers[0].qkv)                        # oneDNN's or the f32 kernels'
    assert isinstance(clone.packed_head, packed_type)               # the head stays float
    assert isinstance(model.layers[0].qkv, packed_type)             # the original is untouched
    assert llm.generate([[5, 6, 7, 8]], params)[0].token_ids == before

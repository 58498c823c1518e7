"""The fused decode layers (kernels/cpu/decode_layers.c through gpu_worker/model/ops/cpu_fused.py)
compute bit for bit what the per-op path computes: hidden states, residual stream and the
K/V written into the paged caches, for every packed format (W8A8 too), with q/k/v bias, input scales,
grouped-query attention, a layer range (a pipeline stage or a draft's first layers) and a
residual carried in, and steps of short chunks (speculative verification) planned as decode
rows; steps with longer prefill chunks keep the per-op path."""
from __future__ import annotations

import pytest
import torch

from gpu_worker.model.attention import ROW_CHUNK_ROWS, build_attention_metadata, plan_native_attention
from gpu_worker.model.config import ModelConfig
from gpu_worker.model.llama import LlamaForCausalLM
from gpu_worker.model.ops.cpu_fused import install
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.ops.cpu_ops import CPU_OPS
from kernels.cpu import linear as L
from kernels.cpu.layers import DecodeLayers, LayerWeights, Projection, available
from kernels.quantize import quantize_int4, quantize_int8

FMTS = ("f32", "bf16", "int8", "int4")
pytestmark = pytest.mark.skipif(not available(set(FMTS)), reason="no C compiler, or neither AVX-512 nor AVX2")
BS, CPU = 16, torch.device("cpu")


def _cfg(layers: int = 3, bias: bool = True) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=layers,
                       num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256,
                       tie_word_embeddings=True, attention_bias=bias,
                       inv_freq=1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16), rope_attention_scaling=1.0,
                       eos_token_ids=(0,), bos_token_id=None)


def _packed(w: torch.Tensor, fmt: str, bias, scaled: bool, g: torch.Generator) -> CpuPackedLinear:
    if fmt in ("f32", "bf16"):
        return CpuPackedLinear.dense(w, fmt, bias)
    if fmt.startswith("w8a8"):   # "w8a8-a32": one activation scale per 32 input features
        group = int(fmt.partition("-a")[2]) if "-a" in fmt else None
        return CpuPackedLinear(L.pack_w8a8(*quantize_int8(w, None), group), bias)
    packed = L.pack_int8(*quantize_int8(w, None)) if fmt == "int8" else L.pack_int4(*quantize_int4(w, 16), 16)
    scale = torch.rand(w.shape[1], generator=g) + 0.5 if scaled else None
    return CpuPackedLinear(packed, bias, scale)


def _model(fmt: str, *, bias: bool = True, scaled: bool = False, layers: int = 3) -> LlamaForCausalLM:
    g = torch.Generator().manual_seed(7)
    model = LlamaForCausalLM(_cfg(layers, bias), CPU_OPS, max_positions=256).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 and p.numel() == 64 else 0.0))
    for layer in model.layers:
        for name in ("qkv", "o_proj", "gate_up", "down"):
            lin = getattr(layer, name)
            setattr(layer, name, _packed(lin.weight, fmt, lin.bias, scaled, g))
    return model


def _step(lens: list[int], q_lens: list[int] | None = None):
    """Sequences of contexts ``lens`` (the new tokens included) over scattered blocks, each
    feeding q_lens[i] new tokens (default: one, a decode row)."""
    q_lens = q_lens or [1] * len(lens)
    tables, nxt = [], 1
    for n in lens:
        blocks = -(-n // BS)
        tables.append(list(range(nxt + blocks - 1, nxt - 1, -1)))
        nxt += blocks
    meta = build_attention_metadata(tables, lens, q_lens, BS, CPU)
    positions = torch.tensor([p for n, q in zip(lens, q_lens) for p in range(n - q, n)])
    return plan_native_attention(meta), positions, nxt


def _caches(model, num_blocks: int, g: torch.Generator):
    cfg = model.cfg
    return [tuple(torch.randn(num_blocks, BS, cfg.num_kv_heads, cfg.head_dim, generator=g) for _ in range(2))
            for _ in model.layers]


def _both(model, x, residual, positions, plan, caches, start, end):
    """forward_layers fused, then per-op, each on its own copy of the caches."""
    assert model.fused_decode is not None and model.fused_decode.takes(x, plan)
    fused_kv = [(k.clone(), v.clone()) for k, v in caches]
    got = model.forward_layers(x.clone(), None if residual is None else residual.clone(), positions,
                               fused_kv[start:end], plan, start, end)
    fused, model.fused_decode = model.fused_decode, None
    ref_kv = [(k.clone(), v.clone()) for k, v in caches]
    want = model.forward_layers(x.clone(), None if residual is None else residual.clone(), positions,
                                ref_kv[start:end], plan, start, end)
    model.fused_decode = fused
    return got, want, fused_kv, ref_kv


@pytest.mark.parametrize("fmt,scaled", [("f32", False), ("bf16", False), ("int8", False), ("int8", True),
                                        ("int4", True), ("w8a8", False), ("w8a8-a32", False)])
@pytest.mark.parametrize("lens", [[5], [1, 17, 40, 33]])
def test_fused_layers_are_bitwise_the_per_op_path(fmt, scaled, lens):
    if fmt.startswith("w8a8") and not L.w8a8_supported():
        pytest.skip("no W8A8 kernel (AVX512_VNNI or AVX2)")
    model = _model(fmt, scaled=scaled)
    assert install(model)
    g = torch.Generator().manual_seed(3)
    plan, positions, blocks = _step(lens)
    caches = _caches(model, blocks, g)
    x = torch.randn(len(lens), 64, generator=g)
    (got_x, got_r), (want_x, want_r), fused_kv, ref_kv = _both(model, x, None, positions, plan, caches, 0, 3)
    assert torch.equal(got_x, want_x) and torch.equal(got_r, want_r)
    for (fk, fv), (rk, rv) in zip(fused_kv, ref_kv):
        assert torch.equal(fk, rk) and torch.equal(fv, rv)


def test_a_layer_range_with_a_residual_carried_in():
    model = _model("f32", bias=False, layers=4)
    assert install(model)
    g = torch.Generator().manual_seed(4)
    plan, positions, blocks = _step([9, 30])
    caches = _caches(model, blocks, g)
    x, residual = torch.randn(2, 64, generator=g), torch.randn(2, 64, generator=g)
    (got_x, got_r), (want_x, want_r), fused_kv, ref_kv = _both(model, x, residual, positions, plan, caches, 1, 3)
    assert torch.equal(got_x, want_x) and torch.equal(got_r, want_r)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fused_kv, ref_kv))
    assert torch.equal(fused_kv[0][0], caches[0][0]) and torch.equal(fused_kv[3][1], caches[3][1])   # untouched


def test_a_step_of_short_chunks_is_bitwise_the_per_op_path():
    """Speculative verification: a decode row beside chunks of 2-4 tokens (each request's last
    token and its drafts) over context, planned as one decode row per token, goes through the
    fused layers with the bits (and the K/V) of the per-op path."""
    model = _model("f32")
    assert install(model)
    g = torch.Generator().manual_seed(5)
    q_lens = [1, 4, 2]
    plan, positions, blocks = _step([9, 30, 20], q_lens)
    caches = _caches(model, blocks, g)
    x = torch.randn(sum(q_lens), 64, generator=g)
    (got_x, got_r), (want_x, want_r), fused_kv, ref_kv = _both(model, x, None, positions, plan, caches, 0, 3)
    assert torch.equal(got_x, want_x) and torch.equal(got_r, want_r)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fused_kv, ref_kv))


def test_steps_with_prefill_rows_and_unpacked_models_keep_the_per_op_path():
    model = _model("f32")
    assert install(model)
    long = ROW_CHUNK_ROWS + 1   # a decode row, then a prefill chunk too long to go as decode rows
    meta = build_attention_metadata([[1], [2, 3]], [5, long], [1, long], BS, CPU)
    assert not model.fused_decode.takes(torch.zeros(1 + long, 64), plan_native_attention(meta))
    plain = LlamaForCausalLM(_cfg(), CPU_OPS, max_positions=256)          # oneDNN/torch projections
    assert not install(plain) and plain.fused_decode is None


def test_refuses_weights_and_steps_it_does_not_take():
    model = _model("f32")
    layer = model.layers[0]
    good = LayerWeights(layer.input_norm.detach(), layer.post_norm.detach(), *(
        Projection(m.packed, m.bias) for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)))
    with pytest.raises(ValueError, match="qkv"):
        DecodeLayers([good], 4, 1, 16, 1e-5)              # the qkv weight has 2 KV heads, not 1
    layers = DecodeLayers([good], 4, 2, 16, 1e-5)
    plan, positions, blocks = _step([5])
    caches = _caches(model, blocks, torch.Generator().manual_seed(1))[:1]
    x, residual = torch.zeros(1, 64), torch.zeros(1, 64)
    args = (model.cos_table, model.sin_table, plan.meta.slot_mapping, plan.decode_tables, plan.decode_lens, BS, 0.25)
    with pytest.raises(ValueError, match="outside the KV cache"):
        layers.run(x, residual, True, caches, 0, positions, *args[:2], plan.meta.slot_mapping + 10_000, *args[3:])
    with pytest.raises(ValueError, match="float32"):
        layers.run(x.double(), residual, True, caches, 0, positions, *args)


def test_a_step_the_c_call_refuses_is_handed_back_unwritten(caplog):
    """The checks run before the C call: a refused step returns None (forward_layers then runs
    it op by op), says so once in the log, and has written no cache."""
    model = _model("f32")
    assert install(model)
    g = torch.Generator().manual_seed(5)
    plan, positions, blocks = _step([7, 20])
    caches = _caches(model, blocks, g)
    before = [(k.clone(), v.clone()) for k, v in caches]
    x = torch.randn(2, 64, generator=g)
    odd = caches[:1] + [(caches[1][0].double(), caches[1][1])] + caches[2:]   # one cache in float64
    assert model.fused_decode(model, x, None, positions, odd, plan, 0) is None
    assert "op by op" in caplog.text
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(caches, before))


def test_a_projection_swapped_after_install_is_noticed():
    """A benchmark that quantizes a loaded model swaps its modules: the next step rebuilds the
    fused layers from the new ones (and computes with them), or drops them if they do not fit."""
    model = _model("f32")
    assert install(model)
    g = torch.Generator().manual_seed(6)
    plan, positions, blocks = _step([9, 14])
    caches = _caches(model, blocks, g)
    x = torch.randn(2, 64, generator=g)
    lin = model.layers[1].gate_up
    model.layers[1].gate_up = _packed(lin.weight * 0.5, "int8", None, False, g)
    old = model.fused_decode
    (got_x, got_r), (want_x, want_r), _, _ = _both(model, x, None, positions, plan, caches, 0, 3)
    assert model.fused_decode is not old and model.fused_decode.current(model)
    assert torch.equal(got_x, want_x) and torch.equal(got_r, want_r)
    model.layers[0].o_proj = torch.nn.Linear(64, 64, bias=False)        # not packed: no fused path
    model.fused_decode(model, x, None, positions, caches, plan, 0)
    assert model.fused_decode is None

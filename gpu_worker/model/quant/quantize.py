"""Weight-only INT8 / INT4 quantization, gpt-fast style: quantize once at load, swap the
model's :class:`Linear` modules for quantized ones.

Formats are those of ``kernels/quantize.py``: INT8 symmetric per output channel, INT4
asymmetric per group of input features (group 128 by default). Embeddings, norms and the
LM head stay in float.

Forward paths (chosen once, at quantization, from the model's ops backend):

- ``triton`` (CUDA): ``kernels.int8_matmul`` / ``kernels.int4_matmul`` dequantize in
  registers: the weights are read at 1 or 0.5625 bytes each.
- ``torch`` (CPU): dequantize, then an fp32 matmul. Measured on the build machine's CPU (2 threads,
  [M, 1536] x [1536, 576], see ``fleet bench quant``): fp32 70 us / 0.78 ms / 2.3 ms at
  M = 1 / 32 / 256; INT8 as ``(x @ q.T) * scale`` 0.24 / 0.85 / 2.6 ms vs
  ``torch._weight_int8pack_mm`` 0.90 / 35 / 258 ms; INT4 dequantize-then-matmul 1.3 / 1.8 /
  3.3 ms vs ``torch._weight_int4pack_mm_for_cpu`` 1.8 / 50 / 418 ms. So the CPU path never
  uses torch's int kernels: quantization saves memory here, not time.

A layer whose in_features is not a multiple of the INT4 group size uses the largest power
of two (>= 16) below it that divides in_features (SmolLM2's 576 -> 64), logged once.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kernels.quantize import dequantize_int4, quantize_int8
from gpu_worker.model.ops.base import Linear
from gpu_worker.model.ops.onednn import PackedLinear
from gpu_worker.model.quant.calibration import LayerInputs, layer_inputs, search_input_scales
from gpu_worker.model.quant.gptq import gptq_int4
from gpu_worker.model.quant.int4_fit import QUICK, fit_int4

logger = logging.getLogger(__name__)

METHODS = ("int8", "int4")
_METHOD_RE = re.compile(r"^(int8|int4)(?:-g(\d+))?$")
CHECKPOINT_FILE = "quantized.safetensors"
CHECKPOINT_META = "quantization.json"


def parse_method(spec: str) -> tuple[str, int]:
    """'int8' | 'int4' | 'int4-g64' -> (method, group_size); ValueError otherwise."""
    m = _METHOD_RE.match(spec or "")
    if not m or (m.group(1) == "int8" and m.group(2)):
        raise ValueError(f"unknown quantization {spec!r}; use int8, int4 or int4-g<group size>")
    group = int(m.group(2) or 128)
    if group < 16 or group & (group - 1):
        raise ValueError(f"int4 group size must be a power of two >= 16, got {group}")
    return m.group(1), group


class Int8Linear(nn.Module):
    """y = x @ (q * scale[:, None]).T (+ b); q [out, in] int8."""

    def __init__(self, out_features: int, in_features: int, bias: bool, use_triton: bool) -> None:
        super().__init__()
        self.use_triton = use_triton
        self.register_buffer("qweight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        if self.use_triton:
            import kernels

            out = kernels.int8_matmul(x, self.qweight, self.scale)
        else:  # the per-channel scale factors out of the K sum
            out = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return out if self.bias is None else out + self.bias


class Int4Linear(nn.Module):
    """y = (x / input_scale) @ dequant(packed, scales, mins).T (+ b); two 4-bit codes a byte.
    ``input_scale`` (per input feature) is present when the weights were quantized with
    activation-aware scales (``calibration.py``), else None."""

    def __init__(self, out_features: int, in_features: int, bias: bool, use_triton: bool, group_size: int,
                 input_scaled: bool = False) -> None:
        super().__init__()
        self.use_triton, self.group_size = use_triton, group_size
        groups = in_features // group_size
        self.register_buffer("packed", torch.empty(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(out_features, groups, dtype=torch.float32))
        self.register_buffer("mins", torch.empty(out_features, groups, dtype=torch.float32))
        self.register_buffer("input_scale", torch.ones(in_features) if input_scaled else None)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        if self.input_scale is not None:
            x = x / self.input_scale.to(x.dtype)
        if self.use_triton:
            import kernels

            out = kernels.int4_matmul(x, self.packed, self.scales, self.mins, self.group_size)
        else:
            out = F.linear(x, dequantize_int4(self.packed, self.scales, self.mins, self.group_size).to(x.dtype))
        return out if self.bias is None else out + self.bias


def int4_group_for(in_features: int, group_size: int) -> int:
    """The group size a layer gets: group_size, or the largest smaller power of two that
    divides in_features; ValueError when even 16 does not."""
    g = group_size
    while g >= 16 and in_features % g:
        g //= 2
    if g < 16:
        raise ValueError(f"in_features {in_features} has no power-of-two group >= 16")
    return g


def _empty_quantized(lin: Linear, method: str, group_size: int, use_triton: bool,
                     input_scaled: bool = False) -> nn.Module:
    out_f, in_f = lin.out_features, lin.in_features
    has_bias = lin.bias is not None
    if method == "int8":
        return Int8Linear(out_f, in_f, has_bias, use_triton)
    return Int4Linear(out_f, in_f, has_bias, use_triton, int4_group_for(in_f, group_size), input_scaled)


def _quantize_linear(lin: Linear, method: str, group_size: int, use_triton: bool,
                     inputs: LayerInputs | None = None) -> nn.Module:
    """Quantized copy of ``lin``. INT4 given calibration ``inputs`` (what the layer received):
    activation-aware input scales, then GPTQ; without: a least-squares fit per group."""
    weight = lin.weight
    calibrated = method == "int4" and inputs is not None
    q = _empty_quantized(lin, method, group_size, use_triton, calibrated).to(weight.device)
    with torch.no_grad():
        if method == "int8":
            q.qweight, q.scale = quantize_int8(weight)
        elif calibrated:
            g = q.group_size

            def quantize_dequantize(w: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
                return dequantize_int4(*fit_int4(w, g, importance, **QUICK), g)

            s, _ = search_input_scales(weight, inputs, quantize_dequantize)
            h = inputs.second_moment.to(s.device) / (s[:, None] * s[None, :])
            q.packed, q.scales, q.mins = gptq_int4(weight.float() * s, h, g)
            q.input_scale.copy_(s)
        else:
            q.packed, q.scales, q.mins = fit_int4(weight, q.group_size)
        if lin.bias is not None:
            q.bias.copy_(lin.bias)
    return q


def _projections(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, name, module) of every float projection that quantization replaces. The LM
    head (also when oneDNN-packed, as ``packed_head``) stays in float."""
    head = getattr(model, "packed_head", None)
    return [(parent, name, child) for parent in model.modules()
            for name, child in parent.named_children()
            if isinstance(child, (Linear, PackedLinear)) and child is not head]


def _swap_linears(model: nn.Module, make) -> int:
    """Replace every projection of model by make(projection); returns how many."""
    targets = _projections(model)
    for parent, name, child in targets:
        setattr(parent, name, make(child))
    return len(targets)


def quantize_model(model: nn.Module, spec: str, *, use_triton: bool | None = None,
                   calibration: list[list[int]] | None = None) -> nn.Module:
    """Swap model's Linear modules for quantized ones, in place, on the weights' device.
    ``use_triton`` defaults to the model's ops backend being ``triton``. For INT4,
    ``calibration`` (token sequences, e.g. ``calibration.calibration_sequences``) turns on
    activation-aware input scales and GPTQ."""
    method, group = parse_method(spec)
    if use_triton is None:
        use_triton = getattr(getattr(model, "ops", None), "name", "torch") == "triton"
    groups: set[int] = set()
    stats: dict[nn.Module, LayerInputs] = {}
    if method == "int4" and calibration:
        targets = {child for _, _, child in _projections(model)}
        stats = layer_inputs(model, calibration, lambda m: m in targets)

    def make(lin: Linear) -> nn.Module:
        q = _quantize_linear(lin, method, group, use_triton, stats.get(lin))
        groups.add(getattr(q, "group_size", 0))
        return q

    n = _swap_linears(model, make)
    if method == "int4" and groups != {group}:
        logger.info("int4: requested group %d; layers use groups %s (in_features not divisible)", group,
                    sorted(groups))
    logger.info("quantized %d linear layers to %s (%s kernels%s)", n, spec, "triton" if use_triton else "torch",
                ", activation-aware + GPTQ" if stats else "")
    return model


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the linear layers' weights and of all parameters and persistent buffers
    (a tied embedding counted once). A oneDNN-packed LM head is a second copy of the
    (tied) embedding: counted in the total and reported apart as ``packed_head_bytes``."""
    seen: set[int] = set()
    total = linear = 0
    head = getattr(model, "packed_head", None)
    head_bytes = head.packed.numel() * head.packed.element_size() if head is not None else 0
    for mod in model.modules():
        if mod is head:
            continue
        is_linear = isinstance(mod, (Linear, PackedLinear, Int8Linear, Int4Linear))
        tensors = list(mod.named_parameters(recurse=False)) + [
            (n, b) for n, b in mod.named_buffers(recurse=False) if n not in mod._non_persistent_buffers_set]
        if isinstance(mod, PackedLinear):
            tensors.append(("packed", mod.packed))
        for _, t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            nbytes = t.numel() * t.element_size()
            total += nbytes
            linear += nbytes if is_linear else 0
    return {"linear_weight_bytes": linear, "total_weight_bytes": total + head_bytes,
            "packed_head_bytes": head_bytes}


def save_quantized(model: nn.Module, spec: str, directory: str | Path) -> Path:
    """Write the quantized model's state (all weights) beside a small JSON header."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous().cpu() for k, v in model.state_dict().items()}
    if getattr(model.cfg, "tie_word_embeddings", False):
        state.pop("lm_head", None)
    save_file(state, str(directory / CHECKPOINT_FILE))
    (directory / CHECKPOINT_META).write_text(json.dumps({"quantization": spec, "format": 1}))
    return directory / CHECKPOINT_FILE


def load_quantized(model: nn.Module, directory: str | Path, *, use_triton: bool | None = None) -> str:
    """Swap model's Linear modules for empty quantized ones and load a checkpoint written by
    :func:`save_quantized`; returns its quantization spec. ValueError if none is there."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta_path = directory / CHECKPOINT_META
    if not meta_path.exists():
        raise ValueError(f"no pre-quantized checkpoint in {directory}")
    spec = json.loads(meta_path.read_text())["quantization"]
    method, group = parse_method(spec)
    if use_triton is None:
        use_triton = getattr(getattr(model, "ops", None), "name", "torch") == "triton"
    state = load_file(str(directory / CHECKPOINT_FILE))
    scaled = any(k.endswith(".input_scale") for k in state)
    _swap_linears(model, lambda lin: _empty_quantized(lin, method, group, use_triton, scaled))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head" and model.cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return spec

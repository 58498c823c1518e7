"""Weight-only INT8 / INT4 quantization, gpt-fast style: quantize once at load, swap the
model's :class:`Linear` modules for quantized ones.

Formats are those of ``kernels/quantize.py``: INT8 symmetric per output channel (``int8``)
or per group of input features (``int8-g<G>``), INT4 asymmetric per group (``int4``, group
32 by default, ``INT4_GROUP``; ``int4-g<G>``). ``w8a8`` is per-channel INT8 whose CPU matmuls also round
the activations to int8 per row; calibrated, its weights are smoothed first (``smooth.py``:
per-input-channel scales that move activation outliers into the weights, divided back out
of the input). Embeddings and norms stay in float; the LM head too unless
the spec ends in ``+head`` (INT8 per channel) or ``+head-<format>`` (``+head-int8-g32``,
``+head-int4-g64``): then ``packed_head`` holds a quantized copy of it.

Forward paths (chosen once, at quantization, from the model's ops backend):

- ``triton`` (CUDA): ``kernels.int8_matmul`` / ``kernels.int4_matmul`` dequantize in
  registers (grouped INT8 has no Triton kernel: it dequantizes, then matmuls).
- ``torch``: dequantize, then a float matmul. On the CPU this is only the fallback: the
  engine swaps these modules for :class:`~gpu_worker.model.ops.cpu_linear.CpuPackedLinear`
  after quantizing (``cpu_pack.py``), whose C kernels read the int8/int4 tiles directly.

This module's modules are the canonical form: what ``save_quantized`` writes, the cache
holds and ``load_quantized`` reads; packing for the CPU is done after, from them.

A layer whose in_features is not a multiple of the group size uses the largest power
of two (>= 16) below it that divides in_features (SmolLM2's 576 -> 64), logged once.
"""
from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kernels.quantize import dequantize_int4, dequantize_int8, half_grid, quantize_int8
from gpu_worker.model.ops.base import Linear
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.ops.onednn import PackedLinear
from gpu_worker.model.quant.calibration import LayerInputs, layer_inputs
from gpu_worker.model.quant.gptq import calibrated_int4
from gpu_worker.model.quant.int4_fit import fit_int4
from gpu_worker.model.quant.groups import activation_group_for, int4_group_for  # noqa: F401 - re-exported
from gpu_worker.model.quant.smooth import head_input_scale, smoothed_int8

logger = logging.getLogger(__name__)

_PART_RE = re.compile(r"^(int8|int4)(?:-g(\d+))?$")
# ``int4``'s group. 32, as Q4_K's sub-blocks: off SmolLM2's shipped 4-bit grid, groups of 32 keep
# more than llama.cpp's Q4_K_M on perplexity and on free-running tokens, groups of 128 (the
# default until 2026-12-07) less on both, for 23 % more bytes and 7-9 % more time at the CPU
# projections (README "int4 in groups of 32 by default").
INT4_GROUP = 32
_W8A8_RE = re.compile(r"^w8a8(?:-a(\d+))?$")
SPEC_HELP = ("use int8, int8-g<group>, int4 or int4-g<group> (group: a power of two >= 16), optionally followed by "
             "+head (the LM head in int8 per channel too) or +head-<one of those>; or w8a8 (int8 per channel with "
             "int8 activations on the CPU, one scale a row) or w8a8-a<group> (one activation scale per group of input "
             "features, a power of two >= 16), optionally +head")


class QuantSpec(NamedTuple):
    """A parsed ``--quantization`` value (:func:`parse_method`)."""
    method: str                                 # the projections' format: "int8" | "int4"
    group_size: int | None                      # input features per scale; None: INT8 per output channel
    head: tuple[str, int | None] | None = None  # the LM head's (method, group_size); None: it stays float
    layers: str = ""                            # the spec without "+head...": what a checkpoint holds
    activations: str = "float"                  # "int8": W8A8 on the CPU (``w8a8``; the weights are ``int8``'s)
    activation_group: int | None = None         # W8A8: input features per activation scale; None: one a row

    @property
    def stored(self) -> str:
        """The layer part with int4's group spelled out (``int4`` -> ``int4-g32``): what
        checkpoints and the calibrated cache record, so weights made under another default group
        are never read as this one's."""
        return f"int4-g{self.group_size}" if self.method == "int4" else self.layers


def _parse_part(part: str, spec: str) -> tuple[str, int | None]:
    m = _PART_RE.match(part)
    if not m:
        raise ValueError(f"unknown quantization {spec!r}; {SPEC_HELP}")
    if m.group(1) == "int8" and not m.group(2):
        return "int8", None
    group = int(m.group(2) or INT4_GROUP)
    if group < 16 or group & (group - 1):
        raise ValueError(f"quantization {spec!r}: the group size must be a power of two >= 16, got {group}")
    return m.group(1), group


def parse_method(spec: str) -> QuantSpec:
    """'int8' -> ('int8', None, None, 'int8'); 'int4-g64+head' -> ('int4', 64, ('int8', None), 'int4-g64');
    'int4' has group INT4_GROUP (32); 'w8a8' -> int8 weights with activations 'int8' ('w8a8-a64': activation group 64);
    ValueError (saying what is
    accepted) for anything else."""
    layers, plus, head = (spec or "").partition("+")
    w8a8 = _W8A8_RE.match(layers)
    if w8a8:   # int8 per-channel codes whose matmuls quantize x per row or group (smoothed when calibrated)
        if plus and head != "head":
            raise ValueError(f"unknown quantization {spec!r}; {SPEC_HELP}")
        act_group = int(w8a8.group(1)) if w8a8.group(1) else None
        if act_group is not None and (act_group < 16 or act_group & (act_group - 1)):
            raise ValueError(f"quantization {spec!r}: the activation group must be a power of two >= 16, "
                             f"got {act_group}")
        return QuantSpec("int8", None, ("int8", None) if plus else None, layers, "int8", act_group)
    method, group = _parse_part(layers, spec)
    if not plus:
        return QuantSpec(method, group, None, layers)
    if head == "head":
        return QuantSpec(method, group, ("int8", None), layers)
    if not head.startswith("head-"):
        raise ValueError(f"unknown quantization {spec!r}; {SPEC_HELP}")
    return QuantSpec(method, group, _parse_part(head[len("head-"):], spec), layers)


class Int8Linear(nn.Module):
    """y = (x / input_scale) @ dequant(q, scale).T (+ b); q [out, in] int8, scale [out] (per
    channel) or [out, in // group_size] (per group of input features). ``input_scale`` (per
    input feature) is present when the weights were smoothed for W8A8 (``smooth.py``), else None."""

    def __init__(self, out_features: int, in_features: int, bias: bool, use_triton: bool,
                 group_size: int | None = None, input_scaled: bool = False) -> None:
        super().__init__()
        self.use_triton, self.group_size = use_triton, group_size
        scale_shape = (out_features,) if group_size is None else (out_features, in_features // group_size)
        self.register_buffer("qweight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(scale_shape, dtype=torch.float32))
        self.register_buffer("input_scale", torch.ones(in_features) if input_scaled else None)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        if self.input_scale is not None:
            x = x / self.input_scale.to(x.dtype)
        if self.group_size is not None:   # no kernel for grouped INT8 here (the CPU path packs it)
            out = F.linear(x, dequantize_int8(self.qweight, self.scale).to(x.dtype))
        elif self.use_triton:
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


def empty_quantized(lin: Linear, method: str, group_size: int | None, use_triton: bool,
                    input_scaled: bool = False) -> nn.Module:
    """An uninitialised quantized module of ``lin``'s shape (a checkpoint is loaded into it)."""
    out_f, in_f = lin.out_features, lin.in_features
    has_bias = lin.bias is not None
    if method == "int8":
        group = None if group_size is None else int4_group_for(in_f, group_size)
        return Int8Linear(out_f, in_f, has_bias, use_triton, group, input_scaled)
    return Int4Linear(out_f, in_f, has_bias, use_triton, int4_group_for(in_f, group_size), input_scaled)


def _quantize_linear(lin: Linear, method: str, group_size: int | None, use_triton: bool,
                     inputs: LayerInputs | None = None, act_group: int | None = None) -> nn.Module:
    """Quantized copy of ``lin``. Given calibration ``inputs`` (what the layer received): INT4
    with activation-aware input scales, then GPTQ; per-channel INT8 smoothed for W8A8
    (``smooth.py``, for activations rounded with one scale per ``act_group`` input features, or
    per row; only W8A8 calibrates INT8). Without: a least-squares fit per group (INT4), absmax
    rounding (INT8). INT4's scales and mins are then rounded to fp16 (``half_grid``), the codes
    kept: rounding inside the fits instead moved the off-grid model's perplexity by +0.16 (groups
    of 32) and +0.36 (of 128), rounding after by +0.01 (README "int4's scales and mins in fp16")."""
    weight = lin.weight
    calibrated = inputs is not None and (method == "int4" or group_size is None)
    q = empty_quantized(lin, method, group_size, use_triton, calibrated).to(weight.device)
    with torch.no_grad():
        if method == "int8" and calibrated:
            q.qweight, q.scale, s, _ = smoothed_int8(weight, inputs, activation_group_for(lin.in_features, act_group))
            q.input_scale.copy_(s)
        elif method == "int8":
            q.qweight, q.scale = quantize_int8(weight, q.group_size)
        elif calibrated:
            q.packed, q.scales, q.mins, s = calibrated_int4(weight, inputs, q.group_size)
            q.input_scale.copy_(s)
        else:
            q.packed, q.scales, q.mins = fit_int4(weight, q.group_size)
        if method == "int4":   # the format's grid is fp16: the fits run in float32, rounded to nearest after
            q.scales, q.mins = half_grid(q.scales, q.mins)
        if lin.bias is not None:
            q.bias.copy_(lin.bias)
    return q


def _projections(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, name, module) of every float projection that quantization replaces (a packed
    one is read through its dense ``weight``). The LM head (``packed_head``) is not one."""
    head = getattr(model, "packed_head", None)
    return [(parent, name, child) for parent in model.modules()
            for name, child in parent.named_children() if child is not head and _is_float_projection(child)]


def _is_float_projection(mod: nn.Module) -> bool:
    return isinstance(mod, (Linear, PackedLinear)) or (isinstance(mod, CpuPackedLinear) and mod.fmt in ("f32", "bf16"))


def swap_linears(model: nn.Module, make) -> int:
    """Replace every projection of model by make(projection); returns how many."""
    targets = _projections(model)
    for parent, name, child in targets:
        setattr(parent, name, make(child))
    return len(targets)


def uses_triton(model: nn.Module, use_triton: bool | None) -> bool:
    """``use_triton``, or when None whether the model's ops backend is ``triton``."""
    if use_triton is None:
        return getattr(getattr(model, "ops", None), "name", "torch") == "triton"
    return use_triton


def quantize_model(model: nn.Module, spec: str, *, use_triton: bool | None = None,
                   calibration: list[list[int]] | None = None) -> nn.Module:
    """Swap model's Linear modules for quantized ones, in place, on the weights' device, and
    quantize the LM head too if ``spec`` says so (:func:`quantize_head`). ``use_triton``
    defaults to the model's ops backend being ``triton``. ``calibration`` (token sequences,
    e.g. ``calibration.calibration_sequences``) turns on, for INT4, activation-aware input
    scales and GPTQ, and for W8A8, smoothing scales (``smooth.py``); other specs ignore it.
    Refused once decode CUDA graphs are captured on the model (they would go on reading the
    float weights' freed memory): quantize at load, ``EngineConfig.quantization``."""
    if getattr(model, "decode_graphs_captured", False):
        raise RuntimeError("quantize_model after the decode CUDA graphs were captured: the graphs would "
                           "read the replaced weights' freed memory; pass quantization= when building the engine")
    parsed = parse_method(spec)
    method, group, head = parsed[:3]
    use_triton = uses_triton(model, use_triton)
    groups: set[int | None] = set()
    stats: dict[nn.Module, LayerInputs] = {}
    smooth_head = calibration and parsed.activations == "int8" and head is not None
    act_group = parsed.activation_group
    head_scale = head_input_scale(model, calibration, act_group) if smooth_head else None   # on the float model
    if calibration and (method == "int4" or parsed.activations == "int8"):
        targets = {child for _, _, child in _projections(model)}
        stats = layer_inputs(model, calibration, lambda m: m in targets)

    def make(lin: Linear) -> nn.Module:
        q = _quantize_linear(lin, method, group, use_triton, stats.get(lin), act_group)
        groups.add(q.group_size)
        return q

    n = swap_linears(model, make)
    if groups != {group}:
        logger.info("%s: requested group %s; layers use groups %s (in_features not divisible)", method, group,
                    sorted(groups))
    logger.info("quantized %d linear layers to %s (%s kernels%s)", n, spec, "triton" if use_triton else "torch",
                "" if not stats else ", smoothed" if method == "int8" else ", activation-aware + GPTQ")
    if head is not None:
        quantize_head(model, head, use_triton=use_triton, input_scale=head_scale)
    return model


def quantize_head(model: nn.Module, head: tuple[str, int | None], *, use_triton: bool | None = None,
                  input_scale: torch.Tensor | None = None) -> None:
    """Set ``model.packed_head`` to a quantized copy of the LM head (``head`` = (method,
    group_size); INT4 uncalibrated). The (tied) float weight stays for the embedding lookups.
    ``input_scale`` [hidden] (W8A8's smoothing of the head, :func:`smooth.head_input_scale`;
    per-channel INT8 only) is multiplied into the weight before quantizing and divided out of
    the head's input."""
    weight = getattr(model, "lm_head", None)
    if not isinstance(weight, torch.Tensor) or not weight.numel():
        return
    smoothed = input_scale is not None and head == ("int8", None)
    lin = SimpleNamespace(weight=weight * input_scale if smoothed else weight, bias=None,
                          out_features=weight.shape[0], in_features=weight.shape[1])
    q = _quantize_linear(lin, head[0], head[1], uses_triton(model, use_triton))
    if smoothed:
        q.input_scale = input_scale.to(weight.device, torch.float32).clone()
    model.packed_head = q
    logger.info("LM head quantized to %s (group %s%s)", *head, ", smoothed" if smoothed else "")


def _module_bytes(mod: nn.Module, seen: set[int]) -> int:
    """Bytes of mod's own parameters, persistent buffers and packed weight not yet in ``seen``."""
    tensors = list(mod.parameters(recurse=False)) + [
        b for n, b in mod.named_buffers(recurse=False) if b is not None and n not in mod._non_persistent_buffers_set]
    nbytes = 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            nbytes += t.numel() * t.element_size()
    if isinstance(mod, PackedLinear):
        nbytes += mod.packed.numel() * mod.packed.element_size()
    if isinstance(mod, CpuPackedLinear):
        nbytes += mod.packed_bytes
    return nbytes


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the linear layers' weights and of all parameters and persistent buffers
    (a tied embedding counted once). A packed or quantized LM head (``packed_head``) is a
    second copy of the (tied) embedding: counted in the total and reported apart as
    ``packed_head_bytes``."""
    seen: set[int] = set()
    head = getattr(model, "packed_head", None)
    head_bytes = 0 if head is None else sum(_module_bytes(m, seen) for m in head.modules())
    total = linear = 0
    for mod in model.modules():
        if head is not None and mod is head:
            continue
        nbytes = _module_bytes(mod, seen)
        total += nbytes
        if isinstance(mod, (Linear, PackedLinear, CpuPackedLinear, Int8Linear, Int4Linear)):
            linear += nbytes
    return {"linear_weight_bytes": linear, "total_weight_bytes": total + head_bytes,
            "packed_head_bytes": head_bytes}

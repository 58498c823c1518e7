"""Pack a quantized model for the CPU: every :class:`Int8Linear` / :class:`Int4Linear` (the
projections and a quantized LM head) becomes a
:class:`~gpu_worker.model.ops.cpu_linear.CpuPackedLinear` over the same codes, scales and
minima in the kernels' tiles (``kernels/cpu/linear.py``), so a decode step reads 1 (INT8) or
0.625 (INT4 in groups of 32, scale and min in fp16) bytes a weight instead of dequantizing to
float32 first.

Packing only rearranges the canonical tensors: the numbers the kernels compute with are the
ones a checkpoint holds (INT4's scales and mins are fp16 values, kept as fp16 in the tiles),
and the results differ from the dequantize-then-matmul path by float32 summation order only.
Where a format's kernel does not run on this CPU, its modules stay as they are
(dequantize-then-matmul) and the log says so once.
"""
from __future__ import annotations

import logging

from torch import nn

from kernels.cpu import linear as packed_linear
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear, kernel_runs
from gpu_worker.model.quant.groups import activation_group_for
from gpu_worker.model.quant.quantize import Int4Linear, Int8Linear

logger = logging.getLogger(__name__)

FALLBACK = "keeping dequantize-then-matmul for those layers"


def packed_module(q: Int8Linear | Int4Linear, w8a8: bool = False, activation_group: int | None = None) -> CpuPackedLinear:
    """The packed twin of one canonical quantized module (same codes, scales, bias and input
    scale); with ``w8a8``, an INT8 module that ``pack_w8a8`` takes (per channel, K a multiple
    of 16) is packed for the W8A8 kernel (activations quantized on the fly, one scale a row or
    per ``activation_group`` input features, :func:`activation_group_for`)."""
    if isinstance(q, Int8Linear):
        if w8a8:
            try:
                group = activation_group_for(q.qweight.shape[1], activation_group)
                return CpuPackedLinear(packed_linear.pack_w8a8(q.qweight, q.scale, group), q.bias, q.input_scale)
            except ValueError:   # grouped scales, or K not a multiple of 16: the weight-only kernel
                pass
        return CpuPackedLinear(packed_linear.pack_int8(q.qweight, q.scale), q.bias, q.input_scale)
    weight = packed_linear.pack_int4(q.packed, q.scales, q.mins, q.group_size)
    return CpuPackedLinear(weight, q.bias, q.input_scale)


def pack_quantized(model: nn.Module, int8_activations: bool = False, activation_group: int | None = None) -> int:
    """Swap model's quantized modules for packed ones, in place, where this CPU runs their
    kernel; with ``int8_activations`` (``--quantization w8a8``, ``w8a8-a<activation_group>``),
    per-channel INT8 ones go to the W8A8 kernel where it runs (AVX512_VNNI, or AVX2), else to
    the weight-only INT8 one. Returns how many were swapped."""
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, (Int8Linear, Int4Linear))]
    runs = {fmt: kernel_runs(fmt, FALLBACK) for fmt in {_fmt(c) for _, _, c in targets}}
    w8a8 = int8_activations and kernel_runs("w8a8", "using the int8 weight-only kernel (float activations)")
    swapped, refused = 0, set()
    for parent, name, child in targets:
        if not runs[_fmt(child)]:
            continue
        try:
            setattr(parent, name, packed_module(child, w8a8, activation_group))
            swapped += 1
        except ValueError as e:   # a shape the tiles do not take (INT4 with one group per row)
            refused.add(str(e))
    logger.info("packed %d of %d quantized layers for the CPU kernels%s", swapped, len(targets),
                f" (the others: {'; '.join(sorted(refused))})" if refused else "")
    return swapped


def _fmt(q: nn.Module) -> str:
    return "int8" if isinstance(q, Int8Linear) else "int4"

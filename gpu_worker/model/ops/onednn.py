"""Prepacked oneDNN matmuls for the CPU path.

On the CPU, torch's ``F.linear`` in float32 calls MKL's sgemm. On the AMD EPYC (AVX-512) of
the build machines, MKL takes its AVX2 code path. For the few rows of a decode step it reads
the weights at 8-16 GB/s, against the 50 GB/s the machine can stream. oneDNN's JIT uses
AVX-512 wherever the CPU has it. With each weight reordered once, at load, into oneDNN's
blocked layout, it ran 2-10x faster than ``F.linear`` on every SmolLM2 projection, from 1 to
1024 rows (``tests/model/test_onednn.py`` checks that it agrees; ``fleet bench linear`` measures
the speed).

Results differ from ``F.linear`` by float32 rounding only (another summation order).
Packing is chosen at load (``model/build.py``): :func:`pack_for_cpu` for CPU float32
models (and bfloat16 ones when the packed-weight kernels of ``cpu_linear.py`` do not serve
them), :func:`pack_head` for the float LM head of a quantized model; ``EngineConfig.onednn``
off (``FLEET_ONEDNN=0``) skips both.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from gpu_worker.model.ops.base import Linear

logger = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packable(dtype: torch.dtype) -> bool:
    """oneDNN can pack weights of ``dtype`` on this CPU (bfloat16 needs AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT; an AVX2-only CPU such as EPYC Milan has neither)."""
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype in PACKABLE_DTYPES


def available() -> bool:
    """oneDNN is built into this torch and exposes the ops."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W held only in oneDNN's blocked layout (no second dense copy).

    ``weight`` unpacks a dense copy on demand: quantizing a copy of a packed model reads it.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        # An opaque oneDNN tensor has no storage to copy; the packed weight is never
        # written after load, so a copy shares it.
        new = PackedLinear.__new__(PackedLinear)
        nn.Module.__init__(new)
        new.out_features, new.in_features, new.packed = self.out_features, self.in_features, self.packed
        new.bias = None if self.bias is None else nn.Parameter(self.bias.detach().clone(), requires_grad=False)
        memo[id(self)] = new
        return new

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_for_cpu(model: nn.Module) -> int:
    """Swap every dense ``Linear`` of a CPU float32/bfloat16 model for a :class:`PackedLinear`
    and give the model a packed LM head (``packed_head``); in place. Returns how many layers
    were packed: 0 when oneDNN is unavailable or the model is not on the CPU in such a dtype."""
    if not _packs(model):
        return 0
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if type(child) is Linear]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child.weight, child.bias))
    pack_head(model)
    logger.info("oneDNN: %d linear layers%s packed", len(targets),
                " and the LM head" if getattr(model, "packed_head", None) is not None else "")
    return len(targets)


def pack_head(model: nn.Module) -> bool:
    """Give a CPU float model whose LM head has no packed copy yet one in oneDNN's layout
    (``packed_head``; a quantized model's float head, say). Returns whether it did."""
    head = getattr(model, "lm_head", None)
    if (getattr(model, "packed_head", None) is not None or not isinstance(head, torch.Tensor) or not head.numel()
            or not _packs(model)):
        return False
    model.packed_head = PackedLinear(head)
    return True


def _packs(model: nn.Module) -> bool:
    """oneDNN is there and the model's weights are on the CPU in a dtype it packs."""
    probe = next((p for p in model.parameters() if p.numel()), None)
    return available() and probe is not None and probe.device.type == "cpu" and packable(probe.dtype)

"""The seam between the decoder and its compute: the ops interface every backend fills
(:class:`ModelOps`) and the dense projection that load-time swaps replace (:class:`Linear`:
oneDNN packing, ``onednn.py``; weight-only quantization, ``model/quant``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelOps:
    name: str
    # (x, residual | None, weight, eps) -> (normed x, new residual)
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    # (positions, cos_table, sin_table) -> rope context shared by all layers of one forward
    prepare_rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]
    # (q, k, rope context) -> (q, k) rotated; may rotate in place (the cpu backend does)
    rope: Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    # (gate_up projection, x) -> silu(gate) * up: the projection and its activation, which a
    # backend may compute in one kernel (the cpu one does for packed f32 weights)
    gated_mlp: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    # AttentionMetadata -> plan shared by all layers of one forward
    plan_attention: Callable[[Any], Any]
    # (q, k, v, k_cache, v_cache, plan, scale) -> out [num_tokens, heads, head_dim]
    attention: Callable[..., torch.Tensor]


def project_then(act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """``gated_mlp`` as two steps: the projection, then ``act`` over its output."""
    return lambda proj, x: act(proj(x))


class Linear(nn.Module):
    """y = x W^T (+ b), weight [out_features, in_features]."""

    def __init__(self, out_features: int, in_features: int, bias: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return F.linear(x, self.weight, self.bias)

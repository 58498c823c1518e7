"""The ``torch`` ops backend: plain torch ops and the CPU paged attention of
``model/attention.py``. The reference the ``cpu`` backend is tested against, and its fallback
wherever a C kernel does not apply."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gpu_worker.model.attention import cpu_paged_attention, plan_cpu_attention
from gpu_worker.model.ops.base import ModelOps, project_then


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama semantics: normalise in float32, cast back, then scale."""
    if x.dtype == torch.float32:
        # One fused kernel; bit-identical to the three-op form in float32.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    # The residual stream is owned by the forward pass, so it is updated in place.
    residual = x if residual is None else residual.add_(x)
    return rms_norm(residual, weight, eps), residual


def prepare_rope(positions, cos_table, sin_table):
    half = cos_table.shape[-1] // 2   # the tables repeat their first half
    cos = cos_table[:, :half].index_select(0, positions).unsqueeze(1)   # [num_tokens, 1, head_dim / 2]
    sin = sin_table[:, :half].index_select(0, positions).unsqueeze(1)
    return cos, sin


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(x1*c - x2*s, x2*c + x1*s): the rotate-half formula with the same roundings as HF's
    ``x*cos + rotate_half(x)*sin``, but without its concatenations."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1).sub_(x2 * sin)
    torch.mul(x2, cos, out=o2).add_(x1 * sin)
    return out


def rope(q, k, ctx):
    cos, sin = ctx
    return _apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), _apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))


def silu_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


TORCH_OPS = ModelOps("torch", add_rms_norm, prepare_rope, rope, silu_and_mul, project_then(silu_and_mul),
                     plan_cpu_attention, cpu_paged_attention)

"""The model's compute ops, chosen once per model: the one switch between backends.

``cpu`` (default off CUDA): the C kernels of ``kernels/cpu`` for the glue between matmuls
and for attention, torch for the rest (``cpu_ops.py``); ``torch`` where they cannot
be built (no C compiler) or ``FLEET_CPU_KERNELS=0``.
``torch``: plain torch ops and the CPU paged attention; the CPU reference.
``triton`` (default on CUDA): the Triton kernels in ``kernels/``. It also runs on CPU tensors
under ``TRITON_INTERPRET=1``, which is how tests exercise the GPU path without a GPU; it is
never chosen on the CPU unless asked for (``FLEET_OPS=triton``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gpu_worker.model.attention import cpu_paged_attention, plan_cpu_attention


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
    # AttentionMetadata -> plan shared by all layers of one forward
    plan_attention: Callable[[Any], Any]
    # (q, k, v, k_cache, v_cache, plan, scale) -> out [num_tokens, heads, head_dim]
    attention: Callable[..., torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama semantics: normalise in float32, cast back, then scale."""
    if x.dtype == torch.float32:
        # One fused kernel; bit-identical to the three-op form in float32.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _torch_add_rms_norm(x, residual, weight, eps):
    # The residual stream is owned by the forward pass, so it is updated in place.
    residual = x if residual is None else residual.add_(x)
    return rms_norm(residual, weight, eps), residual


def _torch_prepare_rope(positions, cos_table, sin_table):
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


def _torch_rope(q, k, ctx):
    cos, sin = ctx
    return _apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), _apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))


def _torch_silu_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


TORCH_OPS = ModelOps("torch", _torch_add_rms_norm, _torch_prepare_rope, _torch_rope, _torch_silu_and_mul,
                     plan_cpu_attention, cpu_paged_attention)


def select_ops(device: torch.device | str, override: str | None = None) -> ModelOps:
    """``override`` (or ``FLEET_OPS``) forces ``cpu``, ``torch`` or ``triton``."""
    choice = override or os.environ.get("FLEET_OPS") or ("triton" if torch.device(device).type == "cuda" else "cpu")
    if choice == "cpu":
        from gpu_worker.model.cpu_native import cpu_kernels

        if cpu_kernels() is None:
            return TORCH_OPS
        from gpu_worker.model.cpu_ops import CPU_OPS

        return CPU_OPS
    if choice == "torch":
        return TORCH_OPS
    if choice == "triton":
        from gpu_worker.model.triton_ops import TRITON_OPS

        return TRITON_OPS
    raise ValueError(f"unknown ops backend {choice!r}; use 'cpu', 'torch' or 'triton'")

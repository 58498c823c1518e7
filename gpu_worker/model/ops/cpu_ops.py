"""The ``cpu`` ops backend: the C kernels of ``kernels/cpu`` for the glue between matmuls and
for attention (decode rows and prefill chunks), the torch ops for everything else and wherever a
kernel does not apply (its wrapper refuses a dtype other than float32 or a layout it does not
take with a ValueError, and the op falls back). ``select_ops`` chooses it on the CPU when the
kernels build (``cpu_native.py``) and ``EngineConfig.cpu_kernels`` is on; the pure-torch
backend is the reference this one is tested against.
"""
from __future__ import annotations

import torch

from gpu_worker.model.attention import cpu_paged_attention, plan_native_attention
from gpu_worker.model.ops import torch_ops
from gpu_worker.model.ops.base import ModelOps
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.ops.cpu_native import loaded_kernels


def add_rms_norm(x, residual, weight, eps):
    out = torch.empty_like(x)
    try:
        loaded_kernels().add_rms_norm(x, residual, weight, eps, out)
    except ValueError:
        return torch_ops.add_rms_norm(x, residual, weight, eps)
    # The residual stream is owned by the forward pass (updated in place, as in torch_ops).
    return out, x if residual is None else residual


def prepare_rope(positions, cos_table, sin_table):
    return positions, cos_table, sin_table


def rope(q, k, ctx):
    positions, cos_table, sin_table = ctx
    try:
        loaded_kernels().rope(q, k, positions, cos_table, sin_table)   # in place: q and k are this layer's own
    except ValueError:
        return torch_ops.rope(q, k, torch_ops.prepare_rope(positions, cos_table, sin_table))
    return q, k


def silu_and_mul(x):
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    try:
        loaded_kernels().silu_and_mul(x, out)
    except ValueError:
        return torch_ops.silu_and_mul(x)
    return out


def gated_mlp(proj, x):
    """The packed f32 gate/up projection and its activation in one kernel where it serves x
    (more than 8 rows: the [n, 2I] product never goes through memory); else the two steps,
    as for a projection with hooks (calibration observes its inputs through its call)."""
    if (type(proj) is CpuPackedLinear and not (proj._forward_hooks or proj._forward_pre_hooks)
            and (act := proj.silu_mul(x)) is not None):
        return act
    return silu_and_mul(proj(x))


CPU_OPS = ModelOps("cpu", add_rms_norm, prepare_rope, rope, silu_and_mul, gated_mlp, plan_native_attention,
                   cpu_paged_attention)

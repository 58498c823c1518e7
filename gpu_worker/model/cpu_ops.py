"""The ``cpu`` ops backend: the C kernels of ``kernels/cpu`` for the glue between matmuls and
for decode attention, the torch ops for everything else and wherever a kernel does not
apply (a dtype other than float32, a layout it does not take). Chosen by default on the CPU
when the kernels build (``gpu_worker/model/cpu_native.py``); ``FLEET_OPS=torch`` or
``FLEET_CPU_KERNELS=0`` keeps the pure-torch backend, the reference this one is tested
against.
"""
from __future__ import annotations

import torch

from gpu_worker.model import ops as torch_ops
from gpu_worker.model.attention import cpu_paged_attention, plan_native_attention
from gpu_worker.model.cpu_native import loaded_kernels


def _f32(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def add_rms_norm(x, residual, weight, eps):
    if not (_f32(x, weight) and x.dim() == 2 and x.is_contiguous()
            and (residual is None or (_f32(residual) and residual.is_contiguous()))):
        return torch_ops._torch_add_rms_norm(x, residual, weight, eps)
    out = torch.empty_like(x)
    loaded_kernels().add_rms_norm(x, residual, weight, eps, out)
    # The residual stream is owned by the forward pass (updated in place, as in torch_ops).
    return out, x if residual is None else residual


def prepare_rope(positions, cos_table, sin_table):
    return positions, cos_table, sin_table


def rope(q, k, ctx):
    positions, cos_table, sin_table = ctx
    if not (_f32(q, k, cos_table, sin_table) and q.stride(2) == k.stride(2) == 1
            and q.stride(1) == k.stride(1) == q.shape[2] and cos_table.stride(1) == 1
            and sin_table.stride() == cos_table.stride() and positions.dtype == torch.int64
            and positions.is_contiguous()):
        return torch_ops._torch_rope(q, k, torch_ops._torch_prepare_rope(positions, cos_table, sin_table))
    loaded_kernels().rope(q, k, positions, cos_table, sin_table)   # in place: q and k are this layer's own
    return q, k


def silu_and_mul(x):
    if not (_f32(x) and x.dim() == 2 and x.is_contiguous()):
        return torch_ops._torch_silu_and_mul(x)
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype)
    loaded_kernels().silu_and_mul(x, out)
    return out


CPU_OPS = torch_ops.ModelOps("cpu", add_rms_norm, prepare_rope, rope, silu_and_mul,
                             plan_native_attention, cpu_paged_attention)

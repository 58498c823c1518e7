"""The ops backends by name, and the one place a model's backend is chosen."""
from __future__ import annotations

import torch

from gpu_worker.config import OPS_BACKENDS
from gpu_worker.model.ops.base import ModelOps
from gpu_worker.model.ops.cpu_native import loaded_kernels
from gpu_worker.model.ops.cpu_ops import CPU_OPS
from gpu_worker.model.ops.torch_ops import TORCH_OPS


def select_ops(device: torch.device | str, backend: str = "auto", *, cpu_kernels: bool = True) -> ModelOps:
    """The ops for a model on ``device``: ``backend`` as ``EngineConfig.ops_backend`` names it;
    ``cpu`` falls back to ``torch`` when ``cpu_kernels`` is off or the C kernels do not build.
    ValueError for an unknown backend."""
    if backend == "auto":
        backend = "triton" if torch.device(device).type == "cuda" else "cpu"
    if backend == "cpu":
        return CPU_OPS if cpu_kernels and loaded_kernels() is not None else TORCH_OPS
    if backend == "torch":
        return TORCH_OPS
    if backend == "triton":
        from gpu_worker.model.ops.triton_ops import TRITON_OPS   # triton is optional off CUDA

        return TRITON_OPS
    raise ValueError(f"unknown ops backend {backend!r}; use one of {OPS_BACKENDS}")

"""The C kernels of ``kernels/cpu`` for this process: built once into the user cache, on the
first CPU model (``FLEET_CPU_KERNELS=0`` keeps the torch path everywhere)."""
from __future__ import annotations

import logging
import threading

from gpu_worker.config import switched_on
from gpu_worker.model.default_model import cache_root

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_loaded = False
_kernels = None


def cpu_kernels():
    """The loaded :class:`kernels.cpu.CpuKernels`, or None (switched off, or no compiler).
    Decides whether the ``cpu`` ops backend is chosen (``ops.select_ops``)."""
    return loaded_kernels() if switched_on("FLEET_CPU_KERNELS") else None


def loaded_kernels():
    """The kernels, built and loaded on first call; None without a compiler. The ``cpu``
    backend's ops call this: once a model has that backend, a later change of
    ``FLEET_CPU_KERNELS`` does not pull its kernels away mid-run."""
    global _loaded, _kernels
    if not _loaded:
        with _lock:
            if not _loaded:
                from kernels.cpu import load

                _kernels = load(cache_root() / "cpu-kernels")
                if _kernels is not None:
                    logger.info("CPU kernels: %s", _kernels.path.name)
                _loaded = True
    return _kernels

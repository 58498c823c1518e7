"""The C kernels of ``kernels/cpu`` for this process: built once into the user cache, on the
first CPU model that asks for them (``select_ops``; ``EngineConfig.cpu_kernels`` off asks for none)."""
from __future__ import annotations

import logging
import threading

from gpu_worker.model.default_model import cache_root

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_loaded = False
_kernels = None


def loaded_kernels():
    """The kernels, built and loaded on first call; None without a compiler. One copy per
    process: every model with the ``cpu`` backend shares it."""
    global _loaded, _kernels
    if not _loaded:
        with _lock:
            if not _loaded:
                from kernels.cpu import load

                _kernels = load(cache_root() / "cpu-kernels")
                if _kernels is not None:
                    logger.info("CPU kernels: %s (%s%s)", _kernels.path.name, _kernels.simd or "portable loops only",
                                ", AMX for bf16" if _kernels.amx_rows else "")
                _loaded = True
    return _kernels

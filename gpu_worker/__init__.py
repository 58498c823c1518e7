"""The worker side of the fleet: the inference engine and its Redis edge.

``from gpu_worker import LLM, SamplingParams`` is the offline API.
"""
from __future__ import annotations

# OpenMP waiters: torch's libgomp spins a while at each barrier, then sleeps. The spin
# keeps the many small ops of a decode step back to back: 240 vs 188 tok/s on
# `fleet bench throughput`'s workload against OMP_WAIT_POLICY=PASSIVE (2 cores, oneDNN
# matmuls). Where other busy processes share the cores (the test suite, several workers
# on one machine), spinning threads steal their time: set OMP_WAIT_POLICY=PASSIVE there
# (tests/conftest.py does). Read when torch loads; the environment decides.
from gpu_worker.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "EngineConfig"]


def __getattr__(name: str):
    # Import torch-heavy modules only when used.
    if name == "LLM":
        from gpu_worker.llm import LLM
        return LLM
    if name == "EngineConfig":
        from gpu_worker.config import EngineConfig
        return EngineConfig
    raise AttributeError(name)

"""The worker side of the fleet: the inference engine and its Redis edge.

``from gpu_worker import LLM, SamplingParams`` is the offline API.
"""
from __future__ import annotations

import os

# OpenMP threads that spin at barriers make every torch op pay for oversubscription when
# another busy process shares the cores (the engine thread plus the Redis client, or a
# test runner): measured 7.0 s vs 0.47 s for the same tiny-model workload on 2 shared
# cores. Sleeping waiters cost little for this engine's op sizes. Set before torch loads;
# an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gpu_worker.sampling_params import SamplingParams  # noqa: E402

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

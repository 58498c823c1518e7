"""The worker side of the fleet: the inference engine and its Redis edge.

``from gpu_worker import LLM, SamplingParams`` is the offline API.
"""
from __future__ import annotations

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

"""The name a model is served under by default: the model's own name, as vLLM's
``--served-model-name`` defaults to its ``--model``. Shared by workers and the gateway, which
never loads a model, so both name one model alike."""
from __future__ import annotations

from pathlib import PurePath

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"  # the workers' model when none is named


def model_name_of(model: str | None) -> str:
    """``None`` (the embedded default) -> ``SmolLM2-135M-Instruct``; a Hugging Face directory
    -> its folder name; a ``.gguf`` file -> its name without the suffix."""
    if not model:
        return EMBEDDED_MODEL_NAME
    path = PurePath(model.rstrip("/\\") or model)
    return path.stem if path.suffix.lower() == ".gguf" else path.name

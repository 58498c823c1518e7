"""Resolve a model name to a local directory and load config, weights and tokenizer."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from gpu_worker.errors import ModelLoadError
from gpu_worker.model.config import ModelConfig, from_hf_config
from gpu_worker.model.default_model import convert_gguf, default_model_dir, gguf_cache_dir

logger = logging.getLogger(__name__)


def resolve_model_dir(model: str | None) -> Path:
    """``None`` is the embedded default; a ``.gguf`` file is converted once and cached; a
    directory must hold a Hugging Face config and safetensors weights."""
    if model is None:
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        target = gguf_cache_dir(path)
        return target if (target / "config.json").exists() else convert_gguf(path, target)
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ModelLoadError(f"{model!r} is neither a GGUF file nor a local Hugging Face model directory "
                         "(no model hub is reached)")


def load_model_config(model_dir: Path) -> ModelConfig:
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(model_dir))
    return from_hf_config(hf_config, _eos_token_ids(model_dir, hf_config))


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All safetensors shards of the directory, on the CPU."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    return {name: t for f in files for name, t in load_file(str(f)).items()}


def _eos_token_ids(model_dir: Path, hf_config) -> tuple[int, ...]:
    """EOS ids from generation_config.json (may be a list), else the model config."""
    gen = model_dir / "generation_config.json"
    eos = json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)

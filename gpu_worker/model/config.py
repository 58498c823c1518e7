"""The model facts the engine needs, read once from a Hugging Face config."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gpu_worker.errors import ModelLoadError

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    inv_freq: torch.Tensor          # [head_dim // 2]
    rope_attention_scaling: float
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None


def from_hf_config(hf_config, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    """Translate a transformers config; refuse architectures this runner cannot run."""
    model_type = getattr(hf_config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    window = getattr(hf_config, "sliding_window", None)
    use_window = getattr(hf_config, "use_sliding_window", model_type == "mistral")
    if window and use_window and window < hf_config.max_position_embeddings:
        raise ModelLoadError(f"sliding-window attention ({window}) is not supported")
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    inv_freq, scaling = _rope(hf_config, head_dim)
    return ModelConfig(
        model_type=model_type,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        rms_norm_eps=hf_config.rms_norm_eps,
        max_position_embeddings=hf_config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(hf_config, "attention_bias", model_type == "qwen2")),
        inv_freq=inv_freq,
        rope_attention_scaling=scaling,
        eos_token_ids=eos_token_ids,
        bos_token_id=getattr(hf_config, "bos_token_id", None),
    )


def _rope(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies through transformers' own RoPE initialisers, so every scaling
    type the config names (linear, llama3, yarn, ...) matches the reference exactly."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "dynamic":
        raise ModelLoadError("dynamic NTK RoPE depends on sequence length and is not supported")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)

"""Helpers for tests and benchmarks: tiny random-weight models with a real tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gpu_worker.model.default_model import default_model_dir

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja", "generation_config.json")


def make_tiny_model(path: str | Path, arch: str = "llama", seed: int = 0, *, num_layers: int = 2,
                    hidden_size: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
                    max_position_embeddings: int = 2048, tie_word_embeddings: bool = False,
                    init_std: float = 0.08) -> str:
    """Write a random-weight ``llama`` or ``qwen2`` model (SmolLM2's tokenizer and vocab) to
    ``path`` in the Hugging Face layout, and return the path. Idempotent. A larger
    ``init_std`` gives peakier next-token distributions."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if (path / "model.safetensors").exists():
        return str(path)
    path.mkdir(parents=True, exist_ok=True)
    src = default_model_dir()
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, path / name)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    extra = {"attention_bias": True} if arch == "qwen2" else {}
    config = AutoConfig.for_model(
        arch, vocab_size=vocab, hidden_size=hidden_size, intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5,
        tie_word_embeddings=tie_word_embeddings, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Larger-than-default init so the random model's next-token choices are not ties.
            if p.dim() > 1:
                p.normal_(0, init_std)
            else:
                p.normal_(0, 0.1).add_(1.0 if "norm" in name else 0.0)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    return str(path)

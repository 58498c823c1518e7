"""Build the speculator an EngineConfig asks for."""
from __future__ import annotations

import logging

from gpu_worker.config import EngineConfig
from gpu_worker.errors import ModelLoadError
from gpu_worker.spec.model_draft import draft_model_drafter, early_exit_drafter, quantized_self_drafter
from gpu_worker.spec.ngram import NgramProposer
from gpu_worker.spec.speculator import Speculator

logger = logging.getLogger(__name__)

PROPOSERS = ("ngram", "draft", "self")


def build_speculator(config: EngineConfig, model, kv_caches: list, tokenizer=None, model_dir=None) -> Speculator | None:
    """The speculator ``config`` asks for (None without speculation), drafting over the
    target ``model`` and its ``kv_caches``. ``tokenizer`` (the target's) provides
    calibration text for an INT4 self-draft, cached by ``model_dir``."""
    kind, bs = config.speculative, config.block_size
    if kind is None:
        return None
    if kind not in PROPOSERS:
        raise ValueError(f"speculative must be one of {PROPOSERS}, got {kind!r}")
    if config.num_speculative_tokens < 1:
        raise ValueError("num_speculative_tokens must be >= 1")
    if kind == "ngram":
        proposer = NgramProposer()
    elif kind == "self" and config.self_draft_quantization:
        proposer = quantized_self_drafter(model, kv_caches, config.self_draft_quantization, bs,
                                          model_dir, tokenizer, cache=config.quant_cache,
                                          huge_pages=config.huge_pages)
    elif kind == "self":
        layers = config.self_draft_layers or max(1, model.cfg.num_layers // 4)
        proposer = early_exit_drafter(model, kv_caches, layers, bs)
    else:
        proposer = draft_model_drafter(_load_draft(config, model), kv_caches[0][0].shape[0], bs,
                                       huge_pages=config.huge_pages)
    logger.info("speculative decoding: %s, up to %d tokens, adaptive=%s", kind,
                config.num_speculative_tokens, config.spec_adaptive)
    return Speculator(proposer, config.num_speculative_tokens, adaptive=config.spec_adaptive)


def _load_draft(config: EngineConfig, target):
    from gpu_worker.model.llama import LlamaForCausalLM
    from gpu_worker.model.loader import load_model_config, load_state_dict, resolve_model_dir

    if not config.draft_model:
        raise ModelLoadError("speculative='draft' needs draft_model (a path)")
    path = resolve_model_dir(config.draft_model)
    cfg = load_model_config(path)
    if cfg.vocab_size != target.cfg.vocab_size:
        raise ModelLoadError(f"draft model vocabulary {cfg.vocab_size} != target's {target.cfg.vocab_size}: "
                             "a draft must share the target's tokenizer")
    draft = LlamaForCausalLM(cfg, target.ops, max_positions=target.cos_table.shape[0])
    draft.load_hf_state_dict(load_state_dict(path))
    return draft.eval().to(target.embed.device)

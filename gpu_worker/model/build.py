"""Build the model an EngineConfig asks for (its switches reach the layers below only as
arguments), and how much memory the KV cache may take there."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from gpu_worker.config import EngineConfig
from gpu_worker.model.config import ModelConfig
from gpu_worker.model.llama import LlamaForCausalLM
from gpu_worker.model.loader import load_state_dict
from gpu_worker.model.ops.backends import select_ops
from gpu_worker.model.ops.cpu_fused import install as install_fused_decode
from gpu_worker.model.ops.cpu_linear import (CpuPackedLinear, install_greedy_head, kernel_runs, pack_dense_for_cpu,
                                             place_on_huge_pages, report_instructions)
from gpu_worker.model.ops.onednn import pack_for_cpu, pack_head

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def build_model(config: EngineConfig, cfg: ModelConfig, model_dir: Path, max_model_len: int,
                tokenizer) -> LlamaForCausalLM:
    """Weights loaded, moved to the device, cast, then (last, so scales keep float32)
    weight-only quantized if asked, INT4 calibrated with ``tokenizer``'s text (once: the
    result is cached, ``quant/cache.py``); then packed for the CPU's matmuls.

    With the ``cpu`` ops backend (the C kernels), quantized projections run on the packed
    int8/int4 kernels (``ops/cpu_linear.py``), and ``dtype="bfloat16"`` means bfloat16
    *weights* only: the projections and the LM head are packed as bf16 tiles while the
    activations, norms, embedding, KV cache and attention stay float32 (:func:`activation_dtype`;
    on a CPU with AMX, bf16 matmuls of 16 rows or more round their input to bf16 for the tile
    unit, ``kernels/cpu/linear_amx.c``).
    float32 weights are packed as f32 tiles for the same kernels. Elsewhere the model is
    cast to ``dtype`` whole, and oneDNN packs fp32/bf16 projections. A head packed as f32
    tiles gets the greedy screen (``config.greedy_screen``; ``kernels/cpu/greedy_head.py``)."""
    device = torch.device(config.device)
    ops = select_ops(device, config.ops_backend, cpu_kernels=config.cpu_kernels)
    model = LlamaForCausalLM(cfg, ops, max_positions=max_model_len)
    model.load_hf_state_dict(load_state_dict(model_dir))
    bf16_weights = ops.name == "cpu" and config.dtype == "bfloat16"
    model.eval().to(device=device, dtype=torch.float32 if bf16_weights else torch_dtype(config.dtype))
    if config.quantization:
        from gpu_worker.model.quant.cache import quantize_for_serving

        quantize_for_serving(model, serving_spec(config), model_dir, tokenizer, cache=config.quant_cache)
        if config.onednn:
            _pack_float_head(model, ops.name == "cpu")
    elif bf16_weights and kernel_runs("bf16", "serving float32 weights instead"):
        pack_dense_for_cpu(model, "bf16")
    elif config.onednn and _f32_kernels(model, ops.name == "cpu"):
        pack_dense_for_cpu(model, "f32")
    elif config.onednn:
        pack_for_cpu(model)
    report_instructions(model)    # what computes each packed format here, once in the log
    if config.greedy_screen:
        install_greedy_head(model)   # when the LM head is packed f32 tiles and the CPU has AVX-512
    place_and_fuse(model, config.huge_pages)
    return model


def place_and_fuse(model: LlamaForCausalLM, huge_pages: bool, shared_with: LlamaForCausalLM | None = None) -> None:
    """The last steps of a model's load, in the order they need: its packed weights onto huge
    pages (unless ``huge_pages`` is False; what ``shared_with`` holds too stays where it is),
    then the fused decode layers (when every projection is packed for the CPU kernels), which
    keep pointers to those weights."""
    if huge_pages:
        place_on_huge_pages(model, shared_with=shared_with)
    install_fused_decode(model)


def _f32_kernels(model: LlamaForCausalLM, cpu_backend: bool) -> bool:
    """float32 weights go to the packed f32 kernels (``ops/cpu_linear.py``) rather than
    oneDNN: with the ``cpu`` backend, where they run. Measured side by side
    (``fleet bench linear``, AMD EPYC Zen 4, 2 threads): 1.3-1.6x oneDNN's speed at one row,
    1.1-1.2x at 64, level (0.97-1.05x) at 256-1024."""
    return (cpu_backend and model.norm.dtype == torch.float32
            and kernel_runs("f32", "packing float32 weights for oneDNN instead"))


def _pack_float_head(model: LlamaForCausalLM, cpu_backend: bool) -> None:
    """A quantized model's LM head, when it stayed float: packed f32 tiles where those
    kernels run, else oneDNN's layout."""
    head = model.lm_head
    if model.packed_head is None and head.numel() and _f32_kernels(model, cpu_backend):
        model.packed_head = CpuPackedLinear.dense(head, "f32")
    pack_head(model)   # no-op when a head is packed already


def serving_spec(config: EngineConfig) -> str:
    """``config.quantization``, with ``+head`` added when ``quantize_lm_head`` asks for a
    quantized LM head and the spec names none."""
    spec = config.quantization
    return f"{spec}+head" if config.quantize_lm_head and "+" not in spec else spec


def activation_dtype(model: LlamaForCausalLM) -> torch.dtype:
    """The dtype of the model's activations, hence of its KV cache: that of its norms, which
    is float32 for a CPU model whose matmul weights are packed as bfloat16."""
    return model.norm.dtype


def kv_budget_bytes(config: EngineConfig) -> int:
    """``kv_cache_memory`` if given, else ``kv_cache_fraction`` of the memory free now on the
    device the cache lives on (host RAM for the CPU, device memory for CUDA)."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    device = torch.device(config.device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        import psutil

        free = psutil.virtual_memory().available
    return int(free * config.kv_cache_fraction)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()

"""Engine options (immutable); derived values such as the block count are computed once
and passed on, never written back. The few switches that have an environment variable read
it here, once, when a config is made; no code below the config reads the environment."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

OPS_BACKENDS = ("auto", "cpu", "torch", "triton")   # EngineConfig.ops_backend (gpu_worker/model/ops)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # the worker's --dtype


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto``: the fastest exact dtype the device has: bfloat16 on CUDA (tensor cores,
    fp32's range), float32 on the CPU (the oneDNN and C kernel paths are fp32). Any other
    value is returned as given."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(device).startswith("cuda") else "float32"

def switched_on(name: str) -> bool:
    """An on/off environment switch that defaults to on: ``0``, ``false``, ``no`` or ``off``
    (any case) turn it off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Options of one engine.

    model: ``None`` for the embedded SmolLM2-135M-Instruct, a local Hugging Face directory,
        or a ``.gguf`` file.
    kv_cache_memory: bytes for the KV cache; ``None`` takes ``kv_cache_fraction`` of the
        memory available after the weights are loaded.
    max_num_batched_tokens: the token budget of one step (prefill chunks + decodes + drafts).
    max_num_seqs: the most requests running at once.
    max_model_len: cap on prompt + output tokens (default: the model's context).
    ops_backend: ``auto`` (``cpu`` on the CPU, ``triton`` on CUDA), ``cpu``, ``torch`` or
        ``triton`` (``model/ops``); default ``$FLEET_OPS``, else ``auto``.
    quantization: weight-only quantization at load (``model/quant``): ``int8`` (per output
        channel), ``int8-g<G>`` (per group of G input features), ``int4`` / ``int4-g<G>``
        (group 32 by default, calibrated); ``+head`` after it quantizes the LM head as well
        (INT8 per channel; ``+head-int8-g32`` etc. name another format).
    quantize_lm_head: quantize the LM head too (as ``+head``) whenever ``quantization`` is
        set and its spec names no head format; ignored without ``quantization``. On the CPU
        the float32 head is half of an INT8 model's bytes per decode step (113 of 220 MB for
        SmolLM2), so this is most of what INT8 can still save there.
    cpu_kernels, onednn, quant_cache, greedy_screen, huge_pages: the C kernels of
        ``kernels/cpu``, oneDNN-packed CPU matmuls, the cache of calibrated INT4 weights, the
        bf16 screen that gives greedy rows their token without the full fp32 LM head (the same
        tokens; ``kernels/cpu/greedy_head.py``), the CPU KV cache and packed weights on
        transparent huge pages (``cpu_tuning.py``); each on unless ``FLEET_CPU_KERNELS``,
        ``FLEET_ONEDNN``, ``FLEET_QUANT_CACHE``, ``FLEET_GREEDY_SCREEN`` or ``FLEET_HUGE_PAGES``
        turns it off (see :func:`switched_on`).
    """

    model: str | None = None
    device: str = "cpu"
    dtype: str = "float32"                  # CPU + bfloat16: only the matmul weights are bf16 (build.py)
    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_fraction: float = 0.2
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    num_threads: int | None = None
    quantization: str | None = None
    quantize_lm_head: bool = False
    speculative: str | None = None          # None, "ngram", "draft" or "self"
    num_speculative_tokens: int = 4         # the most drafts per request per step
    draft_model: str | None = None          # for speculative="draft": same tokenizer as the target
    self_draft_layers: int | None = None    # for speculative="self": early exit after this many layers
    self_draft_quantization: str | None = None  # for speculative="self": draft with own weights, int8/int4
    spec_adaptive: bool = True              # adapt k per request and to the batch's cost
    ops_backend: str = field(default_factory=lambda: os.environ.get("FLEET_OPS") or "auto")
    cpu_kernels: bool = field(default_factory=lambda: switched_on("FLEET_CPU_KERNELS"))
    onednn: bool = field(default_factory=lambda: switched_on("FLEET_ONEDNN"))
    quant_cache: bool = field(default_factory=lambda: switched_on("FLEET_QUANT_CACHE"))
    greedy_screen: bool = field(default_factory=lambda: switched_on("FLEET_GREEDY_SCREEN"))
    huge_pages: bool = field(default_factory=lambda: switched_on("FLEET_HUGE_PAGES"))


def parse_bytes(text: str) -> int:
    """'2GiB', '512MiB', '1.5G', '1000000' -> bytes."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
             "tib": 2**40, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}
    s = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * units[unit])
    return int(float(s))

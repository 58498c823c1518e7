"""Quantize at load, once: calibrated INT4 and W8A8 checkpoints are kept in the user cache.

Calibrated INT4 (the model's own replies as calibration text, activation-aware scales,
GPTQ; see ``calibration.py``) and smoothed W8A8 (the same text, ``smooth.py``) take one to
two minutes on a 2-core CPU, mostly the replies. The result is
saved with ``save_quantized`` under ``<cache>/quantized/`` keyed by the model files
(names, sizes, modification times), the spec, the dtype, the positions the model was built
for (the calibration text is cut to them) and the recipe version, so later
starts load it in about a second, and a changed model or recipe is quantized afresh.
Several workers starting at once each quantize and the first to finish publishes (an
atomic rename). ``EngineConfig.quant_cache`` off (``FLEET_QUANT_CACHE=0``) turns the cache off.
Weight-only INT8 and uncalibrated INT4 take well under a second and are not cached; nor is a
quantized LM head (``+head``): the cache holds the projections of the spec's layer part, so
``int4`` and ``int4+head`` share one entry. What is cached is the canonical form; packing for the
CPU kernels is done after loading it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from gpu_worker.model.default_model import cache_root
from gpu_worker.model.quant.calibration import calibration_sequences
from gpu_worker.model.quant.checkpoint import CHECKPOINT_META, load_head_input_scale, load_quantized, save_quantized
from gpu_worker.model.quant.cpu_pack import pack_quantized
from gpu_worker.model.quant.quantize import parse_method, quantize_head, quantize_model
from gpu_worker.model.quant.smooth import head_input_scale

logger = logging.getLogger(__name__)

# Per calibrated method: change one whenever calibration or fitting changes its output.
RECIPES = {"int4": "int4-selfgen-awq-gptq-1", "w8a8": "w8a8-selfgen-smooth-2"}


def quantize_for_serving(model: nn.Module, spec: str, model_dir: Path | None, tokenizer, *,
                         cache: bool = True, pack: bool | None = None) -> None:
    """Quantize ``model`` in place as ``--quantization spec`` asks: INT4 calibrated with
    ``tokenizer``'s text (with ``cache``, read from the cache when this model was quantized
    so before, else written there), the LM head too if the spec says so; then, with
    ``pack`` (default: the model runs the ``cpu`` ops backend, whose C kernels include the
    packed matmuls), packed for the CPU kernels (``cpu_pack.py``)."""
    parsed = parse_method(spec)
    if tokenizer is None or not calibrated(spec):
        quantize_model(model, spec)
    else:
        head_scale = _calibrated(model, parsed.layers, model_dir, tokenizer, cache)
        if parsed.head is not None:
            quantize_head(model, parsed.head, input_scale=head_scale)
    if pack is None:
        pack = getattr(getattr(model, "ops", None), "name", None) == "cpu"
    if pack:
        pack_quantized(model, int8_activations=parsed.activations == "int8", activation_group=parsed.activation_group)
    elif parsed.activations == "int8":
        logger.warning("%s: int8 activations are a CPU kernel (the cpu ops backend); serving int8 weights only", spec)


def calibrated(spec: str) -> bool:
    """Whether ``spec``'s projections are calibrated (INT4, W8A8), so worth a cache entry."""
    parsed = parse_method(spec)
    return parsed.method == "int4" or parsed.activations == "int8"


def _calibrated(model: nn.Module, spec: str, model_dir: Path | None, tokenizer, cache: bool) -> torch.Tensor | None:
    """Calibrated projections of ``spec`` (no head part): from the cache, else computed and
    cached. Returns the LM head's smoothing scales for W8A8 (found and cached with the
    projections, whether or not this spec quantizes the head), else None."""
    path = cache_path(model, spec, model_dir) if cache else None
    if path is not None and (path / CHECKPOINT_META).exists():
        t0 = time.perf_counter()
        load_quantized(model, path)
        logger.info("%s weights loaded from the cache %s in %.1fs", spec, path, time.perf_counter() - t0)
        return load_head_input_scale(path)
    t0 = time.perf_counter()
    sequences = calibration_sequences(tokenizer, model)
    parsed = parse_method(spec)
    head_scale = (head_input_scale(model, sequences, parsed.activation_group)   # while the model is float
                  if parsed.activations == "int8" else None)
    quantize_model(model, spec, calibration=sequences)
    logger.info("%s calibrated and quantized in %.1fs", spec, time.perf_counter() - t0)
    if path is not None:
        _publish(model, spec, path, head_scale)
    return head_scale


def cache_path(model: nn.Module, spec: str, model_dir: Path | None) -> Path | None:
    """Where the calibrated checkpoint of this model, spec and dtype lives (None: no cache, or
    a spec that is not calibrated).
    Only the spec's layer part counts (``int4+head`` is ``int4``'s entry), with int4's group
    spelled out (``int4`` is ``int4-g32``'s entry, not that of an earlier default group)."""
    if model_dir is None or not calibrated(spec):
        return None
    parsed = parse_method(spec)
    spec, recipe = parsed.stored, RECIPES["w8a8" if parsed.activations == "int8" else parsed.method]
    # The calibration text is cut to the model's positions (max_model_len): part of the key.
    h = hashlib.sha256(f"{recipe}|{spec}|{model.embed.dtype}|{model.cos_table.shape[0]}".encode())
    model_dir = Path(model_dir)
    for f in sorted(model_dir.iterdir()) if model_dir.is_dir() else [model_dir]:
        if f.is_file():
            st = f.stat()
            h.update(f"|{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return cache_root() / "quantized" / f"{model_dir.name}-{spec}-{h.hexdigest()[:16]}"


def _publish(model: nn.Module, spec: str, path: Path, head_scale: torch.Tensor | None) -> None:
    """Write into a private folder, then rename it into place; losing a race (or a disk
    error) only costs the next start a new quantization."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_quantized(model, spec, tmp, head_scale)
        os.rename(tmp, path)
        logger.info("%s weights cached in %s", spec, path)
    except OSError as e:
        logger.warning("could not cache the %s weights in %s: %s", spec, path, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

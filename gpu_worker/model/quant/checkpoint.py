"""Pre-quantized checkpoints: the canonical quantized modules of ``quantize.py`` written to
and read from a safetensors file beside a small JSON header. The calibrated cache
(``cache.py``) and ``fleet quantize`` use them; a quantized LM head is never stored (it is
requantized from the float head in well under a second; for W8A8 only its smoothing scales
are kept, under ``head_input_scale``, since finding them needs the calibration text), nor are
CPU-packed modules: save before packing (``cpu_pack.py``), pack after loading."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from kernels.quantize import half_grid
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.quant.quantize import Int4Linear, empty_quantized, swap_linears, uses_triton, parse_method

CHECKPOINT_FILE = "quantized.safetensors"
CHECKPOINT_META = "quantization.json"


HEAD_SCALE = "head_input_scale"
FORMAT1_INT4_GROUP = 128    # what a bare ``int4`` meant in format-1 headers (2: the group spelled out)


def save_quantized(model: nn.Module, spec: str, directory: str | Path,
                   head_input_scale: torch.Tensor | None = None) -> Path:
    """Write the quantized model's state (all weights but a quantized LM head) and, if given,
    the head's W8A8 smoothing scales, beside a small JSON header naming ``spec``'s layers
    (``QuantSpec.stored``: int4's group spelled out). ValueError for a CPU-packed model."""
    from safetensors.torch import save_file

    head = getattr(model, "packed_head", None)   # never stored, whatever its format
    if any(isinstance(m, CpuPackedLinear) and m is not head for m in model.modules()):
        raise ValueError("save_quantized needs the canonical quantized modules: save before packing for the CPU")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous().cpu() for k, v in model.state_dict().items() if not k.startswith("packed_head.")}
    if getattr(model.cfg, "tie_word_embeddings", False):
        state.pop("lm_head", None)
    if head_input_scale is not None:
        state[HEAD_SCALE] = head_input_scale.detach().float().contiguous().cpu()
    save_file(state, str(directory / CHECKPOINT_FILE))
    (directory / CHECKPOINT_META).write_text(json.dumps({"quantization": parse_method(spec).stored, "format": 2}))
    return directory / CHECKPOINT_FILE


def load_quantized(model: nn.Module, directory: str | Path, *, use_triton: bool | None = None) -> str:
    """Swap model's Linear modules for empty quantized ones and load a checkpoint written by
    :func:`save_quantized`; returns its quantization spec, int4's group spelled out (a
    format-1 header's bare ``int4`` was group 128). int4 scales and mins are rounded to fp16
    (``half_grid``), the format's grid since 2026-12-07. ValueError if none is there."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta_path = directory / CHECKPOINT_META
    if not meta_path.exists():
        raise ValueError(f"no pre-quantized checkpoint in {directory}")
    meta = json.loads(meta_path.read_text())
    spec = meta["quantization"]
    if meta.get("format", 1) == 1 and spec == "int4":   # written when int4's default group was 128
        spec = f"int4-g{FORMAT1_INT4_GROUP}"
    method, group = parse_method(spec)[:2]
    use_triton = uses_triton(model, use_triton)
    state = load_file(str(directory / CHECKPOINT_FILE))
    state.pop(HEAD_SCALE, None)     # the head is quantized by the caller (load_head_input_scale)
    scaled = any(k.endswith(".input_scale") for k in state)
    swap_linears(model, lambda lin: empty_quantized(lin, method, group, use_triton, scaled))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head" and model.cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for mod in model.modules():   # int4's grid is fp16 (a no-op on checkpoints written since 2026-12-07)
        if isinstance(mod, Int4Linear):
            mod.scales, mod.mins = half_grid(mod.scales, mod.mins)
    return spec


def load_head_input_scale(directory: str | Path) -> torch.Tensor | None:
    """The LM head's W8A8 smoothing scales stored by :func:`save_quantized`, or None."""
    from safetensors import safe_open

    with safe_open(str(Path(directory) / CHECKPOINT_FILE), framework="pt") as f:
        return f.get_tensor(HEAD_SCALE) if HEAD_SCALE in f.keys() else None

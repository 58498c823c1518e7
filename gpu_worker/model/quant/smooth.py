"""Smoothed W8A8 (the idea of SmoothQuant, Xiao et al. 2023): calibrated per-input-channel
scales that move the activations' outliers into the weights before both go to 8 bits.

``--quantization w8a8`` rounds each activation row to int8 with one scale per row (its
largest magnitude; ``w8a8-a<G>``: per group of G input features), so a few loud input channels, which every LLM has, leave the other
channels of the row a coarse grid. Each input channel j is divided by
``s_j = amax_j ** alpha / wmax_j ** (1 - alpha)`` (``amax_j`` the channel's largest
activation on calibration text, ``wmax_j`` its largest weight) and its weights multiplied by
``s_j``: the product is unchanged in exact arithmetic, the row's range is flatter, and the
weights, quantized per output channel, take a share of the difficulty. ``alpha`` is searched
per layer for the smallest output error of the whole W8A8 product on the calibration rows
(no smoothing is a candidate too, so the search never does worse than plain W8A8 on them).
The quantized layer divides its input by ``s`` (``Int8Linear.input_scale``; on the CPU the
packed module, or the fused decode layers, divide before the W8A8 matmul).

Measured on SmolLM2-135M-Instruct: see the README (Smoothed W8A8).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu.linear import quantize_rows
from kernels.quantize import dequantize_int8, quantize_int8
from gpu_worker.model.quant.calibration import LayerInputs, prefill_hidden
from gpu_worker.model.quant.groups import activation_group_for

ALPHAS = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9)   # migration strengths tried, beside no smoothing at all


def smoothing_scales(weight: torch.Tensor, act_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [K] = act_max ** alpha / wmax ** (1 - alpha), centred around 1 (geometric mean of its
    extremes); weight [N, K], act_max [K]."""
    wmax = weight.abs().amax(0).clamp_min(1e-5)
    s = act_max.clamp_min(1e-5).pow(alpha) / wmax.pow(1 - alpha)
    return s / (s.max() * s.min()).sqrt()


def w8a8_output(x: torch.Tensor, weight: torch.Tensor, s: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """What the W8A8 kernel computes for x [M, K] against weight [N, K] smoothed by s [K]:
    quantize_rows(x / s, group) @ dequant(int8(weight * s))^T, [M, N] float32."""
    q, scale = quantize_int8(weight * s)
    return F.linear(quantize_rows(x / s, group), dequantize_int8(q, scale))


@torch.no_grad()
def smoothed_int8(weight: torch.Tensor, inputs: LayerInputs,
                  group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(codes [N, K] int8, per-channel scale [N], input scale s [K], alpha) of ``weight``
    [N, K] for W8A8 with one activation scale per ``group`` input features (None: per row): s
    from the alpha in ``ALPHAS`` (or none, s = 1, alpha 0) whose W8A8 output is closest to the
    float one on ``inputs``' sampled rows; the codes quantize weight * s."""
    w = weight.float()
    x = inputs.sample.to(w.device).float()
    act_max = x.abs().amax(0)
    reference = F.linear(x, w)
    candidates = [(0.0, torch.ones(w.shape[1], device=w.device))]
    candidates += [(alpha, smoothing_scales(w, act_max, alpha)) for alpha in ALPHAS]
    errors = [(w8a8_output(x, w, s, group) - reference).pow(2).sum().item() for _, s in candidates]
    best_alpha, best_s = candidates[min(range(len(errors)), key=errors.__getitem__)]
    q, scale = quantize_int8(w * best_s)
    return q, scale, best_s, best_alpha


@torch.no_grad()
def head_input_scale(model, calibration: list[list[int]], group: int | None = None) -> torch.Tensor | None:
    """The smoothing scales [hidden] of ``model``'s LM head for W8A8 (activation ``group``), searched as
    :func:`smoothed_int8` does on the final-normed hidden states of the ``calibration``
    sequences (what the head reads); call it while the model's projections are still float.
    None for a model without a head weight."""
    weight = getattr(model, "lm_head", None)
    if not isinstance(weight, torch.Tensor) or not weight.numel():
        return None
    rows = torch.cat([prefill_hidden(model, seq) for seq in calibration])
    return smoothed_int8(weight, LayerInputs.from_rows(rows), activation_group_for(weight.shape[1], group))[2]

"""GPTQ (Frantar et al. 2022) for the project's INT4 and INT8 formats: round one input
column at a time and spread its rounding error over the columns not yet rounded, in
proportion to how the calibration inputs correlate them (the inverse of H = E[x x^T]).

Each group's grid (INT4: scale and min, ``int4_fit.fit_int4``; INT8: a symmetric scale,
``int8_fit.fit_int8``), both weighted by diag(H)) is fitted when the sweep enters the group,
on the weights as the earlier columns' corrections left them. The results have the exact
formats of ``kernels.quantize``: the kernels do not know how the codes were chosen.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from gpu_worker.model.quant import int4_fit, int8_fit
from gpu_worker.model.quant.calibration import LayerInputs, search_input_scales
from kernels.quantize import INT4_MAX_CODE, dequantize_int4

DAMP = 0.1      # added to H's diagonal, as a fraction of its mean (measured best on SmolLM2 of 0.01 / 0.1)
BLOCK = 128     # columns per lazy update when one grid spans the whole row (INT8 per channel)

# (block [N, g] of corrected weights, importance [g]) -> the group's grid, [N] tensors
FitGroup = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
# (column [N], grid) -> (codes [N], dequantized column [N])
Snap = Callable[[torch.Tensor, tuple[torch.Tensor, ...]], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def gptq_int4(w: torch.Tensor, hessian: torch.Tensor, group_size: int, damp: float = DAMP,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K], hessian [K, K] (E[x x^T] of the layer's inputs) -> (packed [N, K // 2] uint8,
    scales [N, K // g], mins [N, K // g])."""
    def fit(block, importance):
        _, s, m = int4_fit.fit_int4(block, block.shape[1], importance, **int4_fit.QUICK)
        return s[:, 0], m[:, 0]

    def snap(col, grid):
        s, m = grid
        q = torch.round((col - m) / s).clamp_(0, INT4_MAX_CODE)
        return q, q * s + m

    codes, grids = _sweep(w, hessian, group_size, damp, fit, snap)
    codes = codes.to(torch.uint8)
    scales, mins = (torch.stack(t, 1) for t in zip(*grids))
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scales, mins


@torch.no_grad()
def gptq_int8(w: torch.Tensor, hessian: torch.Tensor, group_size: int | None = None, damp: float = DAMP,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K], hessian [K, K] -> (qweight [N, K] int8, scale [N] per channel when
    ``group_size`` is None, else [N, K // group_size]). Per channel, each row's scale is
    fitted on the weights before the sweep (it spans every column)."""
    def fit(block, importance):
        return (int8_fit.fit_int8(block, None, importance, **int8_fit.QUICK)[1],)

    def snap(col, grid):
        q = torch.round(col / grid[0]).clamp_(-int8_fit.INT8_MAX_CODE, int8_fit.INT8_MAX_CODE)
        return q, q * grid[0]

    codes, grids = _sweep(w, hessian, group_size, damp, fit, snap)
    scale = torch.stack([g[0] for g in grids], 1)
    return codes.to(torch.int8), (scale[:, 0].contiguous() if group_size is None else scale)


def _sweep(w: torch.Tensor, hessian: torch.Tensor, group_size: int | None, damp: float,
           fit: FitGroup, snap: Snap) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """The GPTQ column sweep: codes [N, K] (float) and one grid per group, in order. With
    ``group_size`` None one grid, fitted up front, covers each whole row."""
    n, k = w.shape
    g = k if group_size is None else group_size
    if g < 1 or k % g:
        raise ValueError(f"in_features {k} is not a multiple of group_size {group_size}")
    w = w.float().clone()
    h = hessian.float().to(w.device).clone()
    dead = torch.diag(h) <= 0           # inputs that never fired: their weights do not matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * torch.diag(h).mean() * torch.eye(k, device=w.device)
    # Upper Cholesky factor of H^-1: row j holds how column j's error moves columns j..K.
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    importance = torch.diag(h)
    codes = torch.empty(n, k, device=w.device)
    grids = [fit(w, importance)] if group_size is None else []
    step = g if group_size is not None else min(k, BLOCK)
    for b0 in range(0, k, step):
        b1 = b0 + step
        block = w[:, b0:b1]                 # a view: corrected in place column by column
        if group_size is not None:
            grids.append(fit(block, importance[b0:b1]))
        errors = torch.empty_like(block)
        for j in range(step):
            codes[:, b0 + j], value = snap(block[:, j], grids[-1])
            err = (block[:, j] - value) / u[b0 + j, b0 + j]
            block[:, j:] -= err[:, None] * u[b0 + j, b0 + j:b1][None, :]
            errors[:, j] = err
        w[:, b1:] -= errors @ u[b0:b1, b1:]
    return codes, grids


@torch.no_grad()
def calibrated_int4(weight: torch.Tensor, inputs: LayerInputs, group_size: int,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The calibrated INT4 recipe for one projection: activation-aware input scales s
    (``calibration.search_input_scales``), then GPTQ on W * s with H rescaled to match.
    weight [N, K], inputs (what the layer received) -> (packed, scales, mins, s [K]); the
    layer computes (x / s) @ dequantize_int4(packed, scales, mins).T."""
    def quantize_dequantize(w: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
        return dequantize_int4(*int4_fit.fit_int4(w, group_size, importance, **int4_fit.QUICK), group_size)

    s, _ = search_input_scales(weight, inputs, quantize_dequantize)
    h = inputs.second_moment.to(s.device) / (s[:, None] * s[None, :])
    return (*gptq_int4(weight.float() * s, h, group_size), s)

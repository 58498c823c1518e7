"""Clipped INT8 scales (same format as ``kernels.quantize.quantize_int8``).

The absmax scale puts the largest weight of each group (or output channel) on code 127, so
one outlier coarsens the grid of all the others. Here each group tries several clipped
ranges; for each, the codes are rounded, the scale is refitted to them by (weighted) least
squares, the codes are rounded once more, and the group keeps the fit with the smallest
squared error. ``importance`` (one weight per input feature, e.g. E[x^2] of the inputs that
feature meets) weights that error as the layer's output error counts it.
"""
from __future__ import annotations

import torch

INT8_MAX_CODE = 127
SHRINK = tuple(1.0 - 0.02 * i for i in range(11))   # 1.0, 0.98, ..., 0.80
QUICK = {"shrink": (1.0, 0.96, 0.92, 0.88)}   # for fits repeated many times (each GPTQ group)


@torch.no_grad()
def fit_int8(w: torch.Tensor, group_size: int | None = None, importance: torch.Tensor | None = None, *,
             shrink: tuple[float, ...] = SHRINK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (, importance [K] >= 0) -> (qweight [N, K] int8, scale [N] per channel when
    ``group_size`` is None, else [N, K // group_size]), scales float32."""
    n, k = w.shape
    g = k if group_size is None else group_size
    if g < 1 or k % g:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")
    x = w.float().reshape(n, k // g, g)
    h = (torch.ones(1, k // g, g, device=w.device) if importance is None
         else importance.float().to(w.device).reshape(1, k // g, g))
    tiny = torch.finfo(torch.float32).tiny
    amax = x.abs().amax(-1, keepdim=True).clamp_min(tiny)
    best_err = torch.full(amax.shape, float("inf"), device=w.device)
    best_s = amax / INT8_MAX_CODE
    for r in shrink:
        s = amax * r / INT8_MAX_CODE
        s = _refit(x, _codes(x, s), s, h)
        err = (h * (x - _codes(x, s) * s).pow(2)).sum(-1, keepdim=True)
        better = err < best_err
        best_err, best_s = torch.where(better, err, best_err), torch.where(better, s, best_s)
    qweight = _codes(x, best_s).to(torch.int8).reshape(n, k)
    scale = best_s.squeeze(-1).contiguous()
    return qweight, (scale[:, 0].contiguous() if group_size is None else scale)


def _codes(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.round(x / s).clamp_(-INT8_MAX_CODE, INT8_MAX_CODE)


def _refit(x, q, s, h):
    """Least-squares scale for fixed codes q (x ~= q * s, weighted by h); the old one where
    the codes are all zero."""
    sqq = (h * q * q).sum(-1, keepdim=True)
    new = (h * q * x).sum(-1, keepdim=True) / sqq.clamp_min(torch.finfo(torch.float32).tiny)
    return torch.where((sqq > 0) & (new > 0), new, s)

"""GPTQ (Frantar et al. 2022) for the project's INT4 format: round one input column at a
time and spread its rounding error over the columns not yet rounded, in proportion to how
the calibration inputs correlate them (the inverse of H = E[x x^T]).

Each group's (scale, min) is fitted when the sweep enters the group, on the weights as the
earlier columns' corrections left them, with ``int4_fit.fit_int4`` weighted by diag(H). The
result has the exact format of ``kernels.quantize.quantize_int4``: the kernels do not know
how the codes were chosen.
"""
from __future__ import annotations

import torch

from gpu_worker.model.quant.int4_fit import QUICK, fit_int4
from kernels.quantize import INT4_MAX_CODE

DAMP = 0.1      # added to H's diagonal, as a fraction of its mean (measured best on SmolLM2 of 0.01 / 0.1)


@torch.no_grad()
def gptq_int4(w: torch.Tensor, hessian: torch.Tensor, group_size: int, damp: float = DAMP,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K], hessian [K, K] (E[x x^T] of the layer's inputs) -> (packed [N, K // 2] uint8,
    scales [N, K // g], mins [N, K // g])."""
    n, k = w.shape
    if k % group_size:
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
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    scales = torch.empty(n, k // group_size, device=w.device)
    mins = torch.empty_like(scales)
    for g0 in range(0, k, group_size):
        g1 = g0 + group_size
        block = w[:, g0:g1]                 # a view: corrected in place column by column
        _, s, m = fit_int4(block, group_size, importance[g0:g1], **QUICK)
        scales[:, g0 // group_size], mins[:, g0 // group_size] = s[:, 0], m[:, 0]
        s, m = s[:, 0], m[:, 0]
        errors = torch.empty_like(block)
        for j in range(group_size):
            col = block[:, j]
            q = torch.round((col - m) / s).clamp_(0, INT4_MAX_CODE)
            codes[:, g0 + j] = q.to(torch.uint8)
            err = (col - (q * s + m)) / u[g0 + j, g0 + j]
            block[:, j:] -= err[:, None] * u[g0 + j, g0 + j:g1][None, :]
            errors[:, j] = err
        w[:, g1:] -= errors @ u[g0:g1, g1:]
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scales, mins

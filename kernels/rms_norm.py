"""RMSNorm with an optional fused residual add, HF Llama numerics."""

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, next_pow2, require, require_same_device, require_tensor


@triton.jit
def _rmsnorm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    x_stride, residual_stride, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + offs, mask=mask, other=0.0)
        # HF adds in the model dtype: round the sum before normalising it.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_residual_ptr + row * hidden + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * inv_rms).to(x.dtype).to(tl.float32)  # HF: hidden.to(input_dtype) ...
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)  # ... * weight


def fused_add_rmsnorm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor | None,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden], same dtype as x
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [num_tokens, hidden], new_residual [num_tokens, hidden]
    """s = x + residual (rounded to x.dtype; s = x when residual is None);
    returns (weight * rmsnorm(s), s). With residual None, new_residual IS x (no copy).
    Outputs are new contiguous tensors; inputs are never written."""
    require_tensor("x", x, 2, FLOAT_DTYPES)
    require_tensor("weight", weight, 1, FLOAT_DTYPES)
    require(weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    require(weight.shape[0] == x.shape[1], f"weight size {weight.shape[0]} != hidden {x.shape[1]}")
    if residual is not None:
        require_tensor("residual", residual, 2, FLOAT_DTYPES)
        require(residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x")
        require_same_device(x=x, residual=residual, weight=weight)
    require_same_device(x=x, weight=weight)
    num_tokens, hidden = x.shape
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else x
    if num_tokens == 0:
        return out, new_residual
    _rmsnorm_kernel[(num_tokens,)](
        x, residual if residual is not None else x, weight, out, new_residual,
        x.stride(0), residual.stride(0) if residual is not None else 0, hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(hidden),
    )
    return out, new_residual


def rmsnorm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden]
    return fused_add_rmsnorm(x, None, weight, eps)[0]

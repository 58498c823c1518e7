"""SiLU-and-multiply for gated MLPs: silu(gate) * up in one pass."""

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, require, require_tensor

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + inter + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * inter + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * inter] -> [num_tokens, inter]
    """First half of the last dim is the gate, second half the up projection; float32 math,
    one rounding. x may be row-strided."""
    require_tensor("x", x, 2, FLOAT_DTYPES)
    num_tokens, width = x.shape
    require(width % 2 == 0, f"last dim {width} must be even (gate | up)")
    inter = width // 2
    out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(inter))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(inter, block))](x, out, x.stride(0), inter, BLOCK=block)
    return out

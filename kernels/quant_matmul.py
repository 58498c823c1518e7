"""Weight-only quantized matmuls: out = x @ dequantize(w).T, dequantizing tiles in registers.

Layouts and formulas are those of kernels/quantize.py. INT8 applies the per-output-channel
scale once to the float32 accumulator (it factors out of the K sum). INT4 dequantizes each
[BLOCK_K, BLOCK_N] tile to x's dtype before the dot; BLOCK_K divides group_size, so a tile
needs one scale/min per output column.

With few rows (decode) the output tiles alone are too few programs to keep an H200's SMs
streaming weights, so K is split over extra programs whose float32 partial sums are added
afterwards in a fixed order. On the H200 (CUDA-graph replays, one row, the Llama-3-8B
projections; ops/bench/quant_matmul_sweep.py) that took INT8 from 36 / 55 / 100 us to
23 / 55 / 35 us (bf16: 23 / 70 / 43) and INT4 from 77 / 225 / 223 to 57 / 225 / 119.
"""

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, dot_flags, mma, next_pow2, require, require_same_device, require_tensor

BLOCK_K = 64
SM_TARGET = 4 * 132   # programs to aim for with few rows: a few per SM of an H100/H200


@triton.jit
def _int8_matmul_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, x_stride, K_PER_SPLIT,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile over the K range of split program_id(2) (one split: all
    of K into out; several: that split's float32 slice of a [splits, M, N] buffer)."""
    split = tl.program_id(2)
    k_lo = split * K_PER_SPLIT
    k_len = tl.minimum(K_PER_SPLIT, K - k_lo)
    x_ptr += k_lo
    w_ptr += k_lo
    out_ptr += split.to(tl.int64) * M * N
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * x_stride + k[None, :],
                    mask=m_mask[:, None] & (k[None, :] < k_len), other=0.0)
        w = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * K + k[:, None],
                    mask=n_mask[None, :] & (k[:, None] < k_len), other=0)  # [BLOCK_K, BLOCK_N] int8
        # Via float32: int8 values are exact in fp16/bf16, and the interpreter cannot cast
        # integers to bfloat16 directly (it reinterprets them as bfloat16's uint16 storage).
        acc += mma(x, w.to(tl.float32).to(x.dtype), UPCAST, PRECISION)
    scale = tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)
    out = acc * scale[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _int4_matmul_kernel(
    x_ptr, packed_ptr, scales_ptr, mins_ptr, out_ptr, M, N, K, x_stride, K_PER_SPLIT,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """As the INT8 kernel; BLOCK_K divides GROUP_SIZE and K_PER_SPLIT, so a tile takes one
    scale and minimum per output column and needs no K mask."""
    split = tl.program_id(2)
    k_lo = split * K_PER_SPLIT
    k_len = tl.minimum(K_PER_SPLIT, K - k_lo)
    x_ptr += k_lo
    packed_ptr += k_lo // 2
    out_ptr += split.to(tl.int64) * M * N
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    num_groups = K // GROUP_SIZE
    shifts = (offs_k % 2) * 4  # even k: low nibble, odd k: high nibble
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * x_stride + k[None, :], mask=m_mask[:, None], other=0.0)
        byte = tl.load(packed_ptr + offs_n[None, :].to(tl.int64) * (K // 2) + (k // 2)[:, None],
                       mask=n_mask[None, :], other=0)  # [BLOCK_K, BLOCK_N], each byte read twice
        codes = (byte.to(tl.int32) >> shifts[:, None]) & 0xF
        group_offs = offs_n.to(tl.int64) * num_groups + (k_lo + k0) // GROUP_SIZE
        scale = tl.load(scales_ptr + group_offs, mask=n_mask, other=0.0)
        minimum = tl.load(mins_ptr + group_offs, mask=n_mask, other=0.0)
        w = codes.to(tl.float32) * scale[None, :] + minimum[None, :]
        acc += mma(x, w.to(x.dtype), UPCAST, PRECISION)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def _tiles(m: int, n: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): narrow column tiles for small M so a decode GEMV still spreads
    over many programs."""
    block_m = min(64, next_pow2(m, 16))
    return block_m, (32 if m <= 16 else 64)


def _splits(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int) -> int:
    """Split-K count: enough programs to keep every SM streaming weights when the output
    tiles alone are too few (decode-sized M), never a split shorter than 4 blocks of K."""
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    splits = 1
    while tiles * splits < SM_TARGET and k // (2 * splits * block_k) >= 4:
        splits *= 2
    return splits


def _launch(kernel, m: int, n: int, k: int, x: torch.Tensor, args: tuple, config: dict | None,
            max_block_k: int | None = None, **constexprs):
    """Run ``kernel`` over (M tiles, N tiles, K splits); with several splits, into a float32
    [splits, M, N] buffer summed here (deterministic, unlike atomics)."""
    block_m, block_n = _tiles(m, n)
    block_k = BLOCK_K
    if config:
        block_n, block_k = config.get("block_n", block_n), config.get("block_k", block_k)
    block_k = min(block_k, max_block_k or block_k)
    splits = config["splits"] if config and "splits" in config else _splits(m, n, k, block_m, block_n, block_k)
    per_split = triton.cdiv(triton.cdiv(k, block_k), splits) * block_k
    splits = triton.cdiv(k, per_split)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device) if splits == 1 else \
        torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)](
        *args, out, m, n, k, x.stride(0), per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **constexprs, **dot_flags(x.dtype, x.device))
    return out if splits == 1 else out.sum(0).to(x.dtype)


def int8_matmul(
    x: torch.Tensor,  # [M, K] float16 / bfloat16 / float32
    qweight: torch.Tensor,  # [N, K] int8, contiguous
    scale: torch.Tensor,  # [N] float32
    *, config: dict | None = None,   # block_n / block_k / splits, for ops/bench sweeps
) -> torch.Tensor:  # [M, N], dtype of x
    require_tensor("x", x, 2, FLOAT_DTYPES)
    require_tensor("qweight", qweight, 2, (torch.int8,))
    require_tensor("scale", scale, 1, (torch.float32,))
    require_same_device(x=x, qweight=qweight, scale=scale)
    (m, k), n = x.shape, qweight.shape[0]
    require(qweight.shape[1] == k and qweight.is_contiguous(), f"qweight must be contiguous [N, {k}]")
    require(scale.shape[0] == n, f"scale must have {n} entries")
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    return _launch(_int8_matmul_kernel, m, n, k, x, (x, qweight, scale), config)


def int4_matmul(
    x: torch.Tensor,  # [M, K] float16 / bfloat16 / float32
    packed: torch.Tensor,  # [N, K // 2] uint8, contiguous
    scales: torch.Tensor,  # [N, K // group_size] float32, contiguous
    mins: torch.Tensor,  # [N, K // group_size] float32, contiguous
    group_size: int = 128,
    *, config: dict | None = None,   # block_n / block_k / splits, for ops/bench sweeps
) -> torch.Tensor:  # [M, N], dtype of x
    require_tensor("x", x, 2, FLOAT_DTYPES)
    require_tensor("packed", packed, 2, (torch.uint8,))
    require_tensor("scales", scales, 2, (torch.float32,))
    require_tensor("mins", mins, 2, (torch.float32,))
    require_same_device(x=x, packed=packed, scales=scales, mins=mins)
    require(group_size >= 16 and group_size & (group_size - 1) == 0, "group_size must be a power of two >= 16")
    (m, k), n = x.shape, packed.shape[0]
    require(k % group_size == 0, f"K {k} is not a multiple of group_size {group_size}")
    require(tuple(packed.shape) == (n, k // 2) and packed.is_contiguous(), f"packed must be contiguous [N, {k // 2}]")
    for name, t in (("scales", scales), ("mins", mins)):
        require(tuple(t.shape) == (n, k // group_size) and t.is_contiguous(),
                f"{name} must be contiguous [{n}, {k // group_size}]")
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    return _launch(_int4_matmul_kernel, m, n, k, x, (x, packed, scales, mins), config,
                   max_block_k=group_size, GROUP_SIZE=group_size)

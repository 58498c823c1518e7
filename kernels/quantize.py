"""Weight-only quantization (offline, pure torch): INT8 per output channel or per group, INT4 per group.

These functions are both the production quantizers (run once at load time) and, through
the dequantizers, the references the matmul kernels are tested against. All statistics
are computed in float32 and stored in float32 tensors; INT4's scales and minima are fp16
values (:func:`half_grid`), so that the CPU kernels hold them in two bytes each, as
llama.cpp's Q4_1 does, without changing a number.

INT8: symmetric, w ~= q * scale[n] (per channel) or q * scale[n, g] (per group of input
      features), q in [-127, 127].
INT4: asymmetric per group of `group_size` consecutive input features,
      w ~= q * scales[n, g] + mins[n, g], q in [0, 15], two codes per byte along K
      (the even k in the low nibble, the odd k in the high nibble).
"""

import torch

INT4_MAX_CODE = 15
HALF_MAX = 65504.0           # the largest finite fp16
HALF_TINY = 2.0 ** -24       # the smallest positive fp16 (subnormal)


def half_grid(scales: torch.Tensor, mins: torch.Tensor, *, cover: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """INT4 scales and minima rounded to fp16 values (returned as float32): to nearest, or
    with ``cover`` the min down and the scale up, so that ``min + 15 * scale`` still reaches
    the group's maximum when given ``scale = (max - min) / 15``. A positive scale stays
    positive (at least HALF_TINY: codes are found by dividing by it). ValueError where a value
    is not finite or beyond fp16's range (|value| > 65504): such weights have no INT4 form here."""
    for name, t in (("scales", scales), ("mins", mins)):
        bad = ~torch.isfinite(t) | (t.abs() > HALF_MAX)
        if bool(bad.any()):
            raise ValueError(f"INT4 {name} are fp16 values: got {t[bad].flatten()[0].item()!r} "
                             f"(not finite, or beyond +-{HALF_MAX:g})")
    mins = mins.float()
    m = mins.half()
    if cover:
        below = m.float() > mins
        m = torch.where(below, torch.nextafter(m, torch.full_like(m, -HALF_MAX)), m)
    m = m.float()
    want = scales.float() + (((mins - m) / INT4_MAX_CODE).clamp_min(0) if cover else 0)
    s = torch.where(want > 0, want.clamp(HALF_TINY, HALF_MAX), want).half()
    if cover:
        s = torch.where(s.float() < want, torch.nextafter(s, torch.full_like(s, HALF_MAX)), s)
    return s.float(), m


def quantize_int8(w: torch.Tensor, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (qweight [N, K] int8, scale float32): per output channel (scale [N])
    when ``group_size`` is None, else per group of ``group_size`` consecutive input features
    (scale [N, K // group_size]; K must be a multiple of it)."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float tensor, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    g = k if group_size is None else group_size
    if g < 1 or k % g:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")
    wf = w.float().reshape(n, k // g, g)
    # An all-zero group keeps scale > 0 so dequantization never divides by or yields NaN.
    scale = (wf.abs().amax(dim=2) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    qweight = torch.round(wf / scale[..., None]).clamp_(-127, 127).to(torch.int8).reshape(n, k)
    return qweight, (scale[:, 0] if group_size is None else scale)


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(qweight [N, K] int8, scale [N] or [N, K // group]) -> w [N, K] float32."""
    if scale.dim() == 1:
        return qweight.float() * scale.float()[:, None]
    n, k = qweight.shape
    groups = scale.shape[1]
    return (qweight.float().reshape(n, groups, k // groups) * scale.float()[..., None]).reshape(n, k)


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, ...]:
    """w [N, K] float -> (packed [N, K // 2] uint8, scales [N, K // group_size] float32,
    mins [N, K // group_size] float32), min and max rounding on an fp16 grid that covers
    each group (:func:`half_grid`): every weight within half a step of its value.

    K must be a multiple of group_size (ValueError otherwise: padding K would change the
    layer's shape, so pad the weight yourself if you must). group_size must be a power of
    two >= 16, the granularity the matmul kernel tiles K with.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float tensor, got {w.dtype} {tuple(w.shape)}")
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 16, got {group_size}")
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of group_size {group_size}")
    groups = w.float().reshape(n, k // group_size, group_size)
    # A constant group gets a tiny positive scale: its codes dequantize to within half a step.
    scales = ((groups.amax(dim=-1) - groups.amin(dim=-1)) / INT4_MAX_CODE).clamp_min(HALF_TINY)
    scales, mins = half_grid(scales, groups.amin(dim=-1), cover=True)
    codes = torch.round((groups - mins[..., None]) / scales[..., None]).clamp_(0, INT4_MAX_CODE)
    codes = codes.to(torch.uint8).reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scales, mins


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """packed [N, K // 2] uint8 -> codes [N, K] uint8 in [0, 15]."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(
    packed: torch.Tensor,  # [N, K // 2] uint8
    scales: torch.Tensor,  # [N, K // group_size]
    mins: torch.Tensor,  # [N, K // group_size]
    group_size: int,
) -> torch.Tensor:  # [N, K] float32
    codes = unpack_int4(packed).float()
    n, k = codes.shape
    groups = codes.reshape(n, k // group_size, group_size)
    w = groups * scales.float()[..., None] + mins.float()[..., None]
    return w.reshape(n, k)

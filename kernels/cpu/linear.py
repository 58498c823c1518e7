"""Matmuls that read packed fp32 / bf16 / int8 / int4 weights directly (the C kernels of linear.c).

``y = x W^T (+ b)`` with W packed once, at load, by a ``pack_*`` function into tiles of
``TILE`` output channels, K-major inside a tile, so that a tile is one contiguous stream:

- f32:  data [NT, K, TILE] float32
- bf16: data [NT, K, TILE] bfloat16 (rounded to nearest even)
- int8: data [NT, K, TILE] int8, scales [NT, K // G, TILE] float32 (w = q * scale)
- int4: data [NT, K // 2, TILE] uint8, one byte per (k pair, channel): the even k in the low
  nibble, the odd k in the high one; scales and mins [NT, K // G, TILE] float16 (w = q * scale
  + min; the canonical values are fp16 already, :func:`kernels.quantize.half_grid`). Where the
  integer path takes int4 (AVX512_VNNI without AMX, G a multiple of 32: ``quads``), the same
  bytes in the order vpdpbusd takes them instead: data [NT, K // 8, 2, 16, 4], byte [j, h, c, i]
  holding k = 8 j + i of channel 16 h + c in its low nibble and k = 8 j + 4 + i in its high one
  (``linear_digits.c``), and every call runs there.

NT = ceil(N / TILE); the padding channels are zero and never written out.

W8A8 (:func:`pack_w8a8`, :func:`linear_w8a8`; AVX512_VNNI, or AVX2's vpmaddubsw) is separate because it changes
numerics: x is quantized to int8 on the fly, with one scale per row or per group of input
features (:func:`quantize_rows`), and multiplied with int8 per-channel codes in integer dot
products. Its data is [NT, K // 4, TILE, 4] int8 (four consecutive k of a channel together),
scales [NT, 1, TILE], ``group`` the activations' (K: one scale a row), and ``mins`` [NT, K //
group, TILE] holds 128 x each channel's code sum over each group (int32), which takes the
+128 offset of the unsigned activations back out (VNNI; the AVX2 kernel keeps x signed and needs no offset: the same sums). The kernels
dequantize in registers and accumulate in float32; :func:`reference_linear` (dequantize,
then ``F.linear``) is their test oracle. The int8/int4 formats are those of
:mod:`kernels.quantize`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.cpu import process_kernels
from kernels.quantize import dequantize_int4, dequantize_int8, half_grid

TILE = 32
FORMATS = ("f32", "bf16", "int8", "int4")    # the formats of linear(), in linear.c's order


@dataclass(frozen=True)
class PackedWeight:
    """A [N, K] weight in one of :data:`FORMATS`, in the tiled layout above (CPU, contiguous)."""
    fmt: str
    n: int
    k: int
    group: int                   # input features per scale; k for per-channel int8; 0 for f32/bf16
    data: torch.Tensor
    scales: torch.Tensor | None
    mins: torch.Tensor | None
    quads: bool = False          # int4 codes in vpdpbusd's order (the module docstring)


def _tiles(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [ceil(N / TILE), C, TILE], contiguous, padding channels zero."""
    n, c = t.shape
    pad = -n % TILE
    if pad:
        t = torch.cat([t, t.new_zeros(pad, c)])
    return t.reshape(-1, TILE, c).transpose(1, 2).contiguous()


def _untiles(t: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`_tiles`: [NT, C, TILE] -> [n, C]."""
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n]


def _check_weight(w: torch.Tensor, what: str) -> tuple[int, int]:
    if w.dim() != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"{what} must be 2-D and non-empty, got {tuple(w.shape)}")
    return int(w.shape[0]), int(w.shape[1])


def _check_group(k: int, group: int) -> None:
    if group < 16 or group % 16 or k % group:
        raise ValueError(f"group size {group} must be a multiple of 16 that divides K={k}")


def pack_f32(w: torch.Tensor) -> PackedWeight:
    """w [N, K] float -> f32 tiles."""
    n, k = _check_weight(w, "w")
    return PackedWeight("f32", n, k, 0, _tiles(w.detach().float()), None, None)


def pack_bf16(w: torch.Tensor) -> PackedWeight:
    """w [N, K] float -> bf16 tiles (round to nearest even)."""
    n, k = _check_weight(w, "w")
    return PackedWeight("bf16", n, k, 0, _tiles(w.detach().to(torch.bfloat16)), None, None)


def pack_int8(qweight: torch.Tensor, scale: torch.Tensor) -> PackedWeight:
    """quantize_int8's output: qweight [N, K] int8, scale [N] (per channel) or [N, K // G]."""
    n, k = _check_weight(qweight, "qweight")
    if qweight.dtype != torch.int8:
        raise ValueError(f"qweight must be int8, got {qweight.dtype}")
    scale = scale.detach().float()
    scale = scale[:, None] if scale.dim() == 1 else scale
    if scale.dim() != 2 or scale.shape[0] != n or k % scale.shape[1]:
        raise ValueError(f"scale {tuple(scale.shape)} does not fit qweight {(n, k)}")
    group = k // scale.shape[1]
    if scale.shape[1] > 1:
        _check_group(k, group)
    return PackedWeight("int8", n, k, group, _tiles(qweight.detach()), _tiles(scale), None)


def _to_quads(pairs: torch.Tensor) -> torch.Tensor:
    """int4 tiles in k pairs [NT, K // 2, TILE] -> the same codes as quads [NT, K // 8, 2, 16, 4]."""
    nt, half, _ = pairs.shape
    q = torch.stack((pairs & 15, pairs >> 4), dim=2).reshape(nt, half // 4, 2, 4, 2, 16)   # [nt, j, hi, i, h, c]
    return (q[:, :, 0] | (q[:, :, 1] << 4)).permute(0, 1, 3, 4, 2).contiguous()


def _to_pairs(quads: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_to_quads`."""
    nt, blocks = quads.shape[:2]
    q = torch.stack((quads & 15, quads >> 4), dim=2).permute(0, 1, 2, 5, 3, 4)   # [nt, j, hi, i, h, c]
    q = q.reshape(nt, 8 * blocks // 2, 2, TILE)                                   # [nt, k pair, even/odd, ch]
    return (q[:, :, 0] | (q[:, :, 1] << 4)).contiguous()


def pack_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int,
              quads: bool | None = None) -> PackedWeight:
    """quantize_int4's output: packed [N, K // 2] uint8, scales and mins [N, K // group_size],
    kept as float16 (the values the quantizers give are fp16 already; others round to nearest,
    ValueError beyond fp16's range). ``quads``: the codes in vpdpbusd's order (the module
    docstring); None: where this process's kernels take them (:func:`int4_quads`). True where
    they do not: ValueError."""
    n, half = _check_weight(packed, "packed")
    k = 2 * half
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {packed.dtype}")
    _check_group(k, group_size)
    if group_size == k:
        raise ValueError("int4 needs groups smaller than K (per-channel int4 is not served)")
    shape = (n, k // group_size)
    if tuple(scales.shape) != shape or tuple(mins.shape) != shape:
        raise ValueError(f"scales/mins must be {shape}, got {tuple(scales.shape)}, {tuple(mins.shape)}")
    scales, mins = half_grid(scales.detach().float(), mins.detach().float())
    here = int4_quads(k, group_size)
    if quads and not here:
        raise ValueError(f"int4 quads need AVX512_VNNI without AMX and groups of a multiple of 32 (K = {k}, "
                         f"group {group_size})")
    data = _tiles(packed.detach())
    quads = here if quads is None else quads
    return PackedWeight("int4", n, k, group_size, _to_quads(data) if quads else data, _tiles(scales.half()),
                        _tiles(mins.half()), quads)


def int4_quads(k: int, group: int) -> bool:
    """Whether :func:`pack_int4` lays int4 weights of K = ``k`` in groups of ``group`` out as
    quads here: AVX512_VNNI without AMX, ``group`` a multiple of 32 (``fleet_int4_quads``)."""
    lib = _library()
    return lib is not None and lib.int4_quads(k, group) > 0


def pack_w8a8(qweight: torch.Tensor, scale: torch.Tensor, group: int | None = None) -> PackedWeight:
    """quantize_int8's per-channel output (qweight [N, K] int8, scale [N]; K % 16 == 0) for
    :func:`linear_w8a8`, whose input gets one int8 scale per ``group`` input features (None: one
    per row; else a multiple of 16 dividing K). ``mins`` holds each group's offset share."""
    n, k = _check_weight(qweight, "qweight")
    if qweight.dtype != torch.int8 or scale.shape != (n,) or k % 16:
        raise ValueError(f"W8A8 needs int8 codes [N, K] with K % 16 == 0 and a per-channel scale [N], "
                         f"got {qweight.dtype} {(n, k)} and {tuple(scale.shape)}")
    group = k if group is None else group
    if group < 16 or group % 16 or k % group:
        raise ValueError(f"W8A8's activation group must be a multiple of 16 dividing K = {k}, got {group}")
    if bool((qweight == -128).any()):   # the AVX2 kernel moves x's sign onto the codes
        raise ValueError("W8A8 needs codes in [-127, 127] (quantize_int8's range), got -128")
    tiles = _tiles(qweight.detach())                                    # [NT, K, TILE]
    data = tiles.reshape(-1, k // 4, 4, TILE).transpose(2, 3).contiguous()   # [NT, K // 4, TILE, 4]
    sums = qweight.detach().to(torch.int32).reshape(n, k // group, group).sum(2)   # [N, K // G]
    comps = _tiles((sums * 128).to(torch.int32))                                  # [NT, K // G, TILE]
    return PackedWeight("w8a8", n, k, group, data, _tiles(scale.detach().float()[:, None]), comps)


def dequantize(w: PackedWeight) -> torch.Tensor:
    """The [N, K] float32 weight that ``w`` stands for."""
    if w.fmt == "w8a8":
        return dequantize_int8(_untiles(w.data.transpose(2, 3).reshape(w.data.shape[0], w.k, TILE), w.n),
                               _untiles(w.scales, w.n))
    data = _untiles(_to_pairs(w.data) if w.quads else w.data, w.n)
    if w.fmt in ("f32", "bf16"):
        return data.float()
    scales = _untiles(w.scales, w.n)
    if w.fmt == "int8":
        return dequantize_int8(data, scales)
    return dequantize_int4(data, scales, _untiles(w.mins, w.n), w.group)


def reference_linear(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure torch: dequantize, then ``F.linear`` in float32 (the kernels' test oracle), over
    the operands the kernels multiply (:func:`operands`: x rounded to bf16, or x and w split
    into bf16 parts, where the AMX tiles take the call)."""
    y = sum(F.linear(xp, wp) for xp, wp in operands(x.float(), w))
    return y if bias is None else y + bias.float()


def operands(x: torch.Tensor, w: PackedWeight) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (x part, weight part) pairs whose products the kernels sum for a call of x's rows
    over ``w`` (float32 tensors). Usually ``[(x, dequantize(w))]``; on a CPU with AMX, K a
    multiple of 32 (``linear_amx.c``): bf16 from ``amx_rows`` rows ``[(bf16(x), w)]``, and
    int8/int4 from ``amx_split_rows[fmt]`` rows x and w as bf16 hi + lo, the lo x lo product
    dropped (per-channel int8 codes are exact in bf16, so there w has no lo part); from
    ``digit_rows()`` rows on a CPU with AVX512_VNNI and no AMX, the weights that
    :func:`takes_digits` (``linear_digits.c``), and int4 quads at every row count:
    ``[(digits(x), w)]``."""
    wd, rows, lib = dequantize(w), x.shape[0], _library()
    if lib is not None and takes_digits(w) and (w.quads or 0 < lib.digit_rows() <= rows):
        return [(digits(x, digit_group(w)), wd)]
    if lib is None or w.k % 32:
        return [(x, wd)]
    if w.fmt == "bf16" and 0 < lib.amx_rows <= rows:
        return [(_bf16(x), wd)]
    if w.fmt in ("int8", "int4") and 0 < lib.amx_split_rows[w.fmt] <= rows:
        xh, wh = _bf16(x), _bf16(wd)
        if w.fmt == "int8" and w.group == w.k:
            return [(xh + _bf16(x - xh), wd)]
        return [(xh, wh), (_bf16(x - xh), wh), (xh, _bf16(wd - wh))]
    return [(x, wd)]


DIGIT_GROUP = 64   # linear_digits.c's XG


def digit_group(w: PackedWeight) -> int:
    """x's group on the two-byte path over ``w``, as the kernels choose it (``x_group`` in
    ``linear_digits.c``): 64, or 32 for int4 in groups of 32 (each x group inside one weight
    group); 0 where the path does not take ``w`` (int4 in k pairs), or without the kernels."""
    lib = _library()
    return lib.digit_group(w.fmt, w.k, w.group, w.quads) if lib is not None and w.fmt in ("int8", "int4") else 0


def digits(x: torch.Tensor, group: int = DIGIT_GROUP) -> torch.Tensor:
    """x [M, K] as the int8 and int4 kernels' two-byte path carries it (``linear_digits.c``):
    over each ``group`` input features of a row (:func:`digit_group`), s = max|x| / 32767 and
    round(x / s) * s, the integer clamped to [-32767, 32767]; NaN over a group holding a value
    that is not finite."""
    x = x.float()
    m, k = x.shape
    g = x.reshape(m, k // group, group)
    amax = g.abs().amax(dim=2, keepdim=True)
    s = torch.where(amax > 0, amax / 32767.0, torch.ones_like(amax))
    s = torch.where(g.isfinite().all(dim=2, keepdim=True), s, torch.full_like(s, float("nan")))
    return (torch.round(g / s).clamp_(-32767, 32767) * s).reshape(m, k)


def takes_digits(w: PackedWeight) -> bool:
    """Whether calls over ``w`` take the two-byte path: per-channel int8 (K a multiple of 64)
    from ``digit_rows()`` rows, int4 quads at every row count (``fleet_digits_take``)."""
    return digit_group(w) != 0


def quads_prefetch(nbytes: int | None = None) -> int:
    """How far ahead (bytes) calls over int4 quads that split nibbles in registers prefetch
    their stream, set where not None (0: off, -1: this CPU's default); speed only. 0 where no
    kernels built."""
    lib = _library()
    return 0 if lib is None else lib.quads_prefetch(nbytes)


def quads_split(rows: int | None = None) -> int:
    """From how many rows calls over int4 quads split each tile's nibbles into a buffer once
    (0: never), set where not None (-1: this CPU's default: Intel past 6 rows, AMD never);
    speed only. 0 where no kernels built."""
    lib = _library()
    return 0 if lib is None else lib.quads_split(rows)


def digit_rows() -> int:
    """From how many rows per-channel int8 calls (:func:`takes_digits`) carry x as two bytes a
    value (integer dot products, ``linear_digits.c``): AVX512_VNNI without AMX; 0 where no call
    does. (int4 quads: every call, whatever it says.)"""
    lib = _library()
    return 0 if lib is None else lib.digit_rows()


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def _library():
    """This process's CPU kernels (built on first use), or None."""
    return process_kernels()


def tuning(*, prefetch_far: bool | None = None, f32_pairs: bool | None = None,
           wide_prefetch: bool | None = None, one_row_prefetch: bool | None = None,
           codes_halves: bool | None = None) -> dict[str, bool]:
    """The matmuls' five speed tunings, set where given, as they are afterwards:
    ``prefetch_far`` (prefetch into L2, and calls of 2-7 rows ahead of their own stream),
    ``f32_pairs`` (f32 past 48 rows in blocks of 6 rows x 64 channels), ``wide_prefetch``
    (f32 calls of 25-48 rows prefetch the next tile in their passes, as calls of 9-24 rows
    always do) and ``one_row_prefetch`` (one-row calls prefetch ahead of their own stream:
    bf16 and int8 codes; in AVX2 builds int8, int4 and W8A8). The first three are on by default
    on Intel CPUs and off on AMD, where they were not measured faster; the fourth on Intel and
    in AVX2 builds (on AMD Zen 4 it was slower: ``linear.c``); ``codes_halves`` (AVX2 builds
    only, on there: int8 calls of 4-8 rows and int4 calls of 4-5 run each
    tile in halves of 16 channels decoded in registers rather than through a float32 buffer,
    the same products: ``linear.c``, ``codes_tile_rows``). None
    changes a result; ``tuning(**previous)`` puts them back. {} where the kernels did not build."""
    lib = _library()
    return {} if lib is None else lib.linear_tuning(prefetch_far, f32_pairs, wide_prefetch, one_row_prefetch,
                                                    codes_halves)


@functools.cache
def supported(fmt: str) -> bool:
    """The kernels built and this CPU runs ``fmt``'s fast path (AVX-512 F/BW or AVX2 with FMA and F16C; "w8a8":
    :func:`w8a8_supported`). Asked once per format and process (the library is built once)."""
    if fmt == "w8a8":
        return w8a8_supported()
    lib = _library()
    return fmt in FORMATS and lib is not None and lib.linear_supported(FORMATS.index(fmt))


_READ = {"f32": "", "bf16": "widened to f32 in registers, ", "int8": "codes decoded in registers, ",
         "int4": "codes decoded in registers, "}


def instructions(fmt: str) -> str:
    """In words, what computes ``fmt``'s matmuls in this process: the build's vector
    instructions, the AMX tiles from the row count where they take over, or the torch
    reference where the kernel does not run. The engine logs it once per format."""
    lib = _library()
    if not supported(fmt):
        return "the torch reference (the C kernel for it did not build or does not run on this CPU)"
    simd = {"avx512": "AVX-512", "avx2": "AVX2"}[lib.simd]
    if fmt == "w8a8":
        if lib.simd == "avx2":
            return "AVX2 integer dot products (vpmaddubsw; this CPU has no AVX512_VNNI)"
        amx = (f", AMX-INT8 tiles for calls of {lib.amx_w8a8_rows} rows or more with one x scale a row"
               if lib.amx_w8a8_rows else "")
        return f"AVX512_VNNI integer dot products (vpdpbusd){amx}"
    if fmt == "int4" and lib.int4_quads(64, 64):
        return ("in groups of 32 or more: AVX512_VNNI integer dot products (vpdpbusd) at every row count, over "
                "codes packed as quads and x as two bytes a value (16 bits a group of 64, or 32 with groups of "
                f"32); groups of 16: {_READ[fmt]}{simd} float32 FMAs")
    if fmt == "int8" and lib.digit_rows():
        return (f"{_READ[fmt]}{simd} float32 FMAs; per channel from {lib.digit_rows()} rows AVX512_VNNI integer "
                "dot products (vpdpbusd) over x as two bytes a value (16 bits a group of 64)")
    rows = lib.amx_rows if fmt == "bf16" else lib.amx_split_rows.get(fmt, 0)
    amx = (f"; AMX bf16 tiles from {rows} rows" + (" (x rounded to bf16 there)" if fmt == "bf16"
                                                   else " (x and w as two bf16 each)")) if rows else ""
    return f"{_READ[fmt]}{simd} float32 FMAs{amx}"


def _check_call(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None, out: torch.Tensor | None) -> None:
    """ValueError for inputs the kernels do not take (callers then fall back)."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or not x.is_contiguous():
        raise ValueError("linear needs x as a contiguous float32 CPU [M, K] tensor")
    if x.shape[1] != w.k:
        raise ValueError(f"x has {x.shape[1]} features, the weight takes {w.k}")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (w.n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous float32 [{w.n}] tensor")
    if out is not None and (out.dtype != torch.float32 or out.shape != (x.shape[0], w.n) or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous float32 [{x.shape[0]}, {w.n}] tensor")


def linear(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 -> [M, N] float32 (written into ``out`` when given). Where the kernels
    do not run on this CPU (see :func:`supported`) it computes :func:`reference_linear`."""
    if w.fmt not in FORMATS:
        raise ValueError(f"linear takes {FORMATS} weights, got {w.fmt} (W8A8: linear_w8a8)")
    _check_call(x, w, bias, out)
    if out is None:
        out = torch.empty(x.shape[0], w.n, dtype=torch.float32)
    if not supported(w.fmt):
        return out.copy_(reference_linear(x, w, bias))
    _library().linear(x, w, bias, out)
    return out


def linear_silu_mul(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """silu(y[:, :N / 2]) * y[:, N / 2:] for y = ``linear(x, w, bias)`` (a gate/up projection and
    its activation), [M, N / 2] float32, in one kernel call that never writes y: the same bits
    as ``linear`` then the ``cpu`` backend's silu_and_mul. None where that kernel does not
    serve the call (not f32, 8 rows or fewer, N / 2 not a multiple of 32, no AVX-512): the
    caller takes the two steps then."""
    if w.fmt != "f32" or not supported("f32") or x.shape[0] <= 8 or w.n % (2 * TILE):
        return None
    _check_call(x, w, bias, None)
    out = torch.empty(x.shape[0], w.n // 2, dtype=torch.float32)
    return out if _library().linear_silu_mul(x, w, bias, out) else None


def quantize_rows(x: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """x [M, K] -> the float32 values W8A8 multiplies: round(x / s) * s, s = max|x| / 127 over each
    row, or over each ``group`` of input features of a row (a divisor of K)."""
    x = x.float()
    m, k = x.shape
    g = x.reshape(m, k // (group or k), group or k)
    amax = g.abs().amax(dim=2, keepdim=True)
    s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return (torch.round(g / s).clamp_(-127, 127) * s).reshape(m, k)


@functools.cache
def w8a8_supported() -> bool:
    """The kernels built and this CPU runs :func:`linear_w8a8`'s fast path (AVX512_VNNI, or AVX2)."""
    lib = _library()
    return lib is not None and lib.linear_w8a8_supported()


def reference_w8a8(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure torch W8A8: quantize_rows(x, w.group), then F.linear with the dequantized weight."""
    return F.linear(quantize_rows(x, w.group), dequantize(w), None if bias is None else bias.float())


def linear_w8a8(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 -> [M, N] float32 with x quantized to int8 per row or per ``w.group``
    (changes numerics: see :func:`quantize_rows`); :func:`reference_w8a8` where the kernel does not run."""
    if w.fmt != "w8a8":
        raise ValueError(f"linear_w8a8 needs a pack_w8a8 weight, got {w.fmt}")
    _check_call(x, w, bias, out)
    if out is None:
        out = torch.empty(x.shape[0], w.n, dtype=torch.float32)
    if not w8a8_supported():
        return out.copy_(reference_w8a8(x, w, bias))
    _library().linear_w8a8(x, w, bias, out)
    return out

"""C kernels for the CPU path, compiled at first use and called through ctypes.

The source ships with the package; :func:`load` compiles it once per machine with the
system C compiler (``$CC``, else ``cc``/``gcc``), ``-O3 -march=native -fopenmp``, into a
cache folder, and reuses the library on later starts. The cache key covers the source, the
flags, the compiler's version and the CPU's flags, so another machine kind or a changed
kernel gets its own build. A missing compiler or a failed build returns None: callers keep
their torch path.

The OpenMP runtime: ``-fopenmp`` links ``libgomp.so.1``, the soname of the libgomp that
torch's CPU wheels bundle and have already loaded, so the kernels run on torch's own thread
pool rather than a second one that would compete with it for the cores.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from kernels import cpuinfo

logger = logging.getLogger(__name__)

SOURCES = ("paged_decode.c", "paged_prefill.c", "glue.c", "linear.c", "linear_amx.c", "linear_w8a8.c",
           "linear_digits.c", "decode_layers.c", "greedy_head.c")
HEADERS = ("kernels.h", "simd.h", "paged.h", "linear.h", "tile_decode.h")
# -ffp-contract=off: no fused multiply-adds beyond the ones the kernels ask for, so the glue
# rounds as torch does (glue.c).
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=gnu11")
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_LINEAR_FORMATS = {"f32": 0, "bf16": 1, "int8": 2, "int4": 3}   # linear.c's format codes (linear.FORMATS)
INT4_QUADS = 5   # linear.c's code for int4 packed as quads (linear.pack_int4; FMT_INT4Q)


def linear_code(w) -> int:
    """linear.c's format code for a linear.PackedWeight (int4 quads apart)."""
    return INT4_QUADS if w.quads else _LINEAR_FORMATS[w.fmt]


class CpuKernels:
    """The loaded library, with checked wrappers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        # The vector instruction set of the build (simd.h), or None: portable loops only.
        self.simd = {2: "avx512", 1: "avx2"}.get(_fn(lib.fleet_simd)())
        # bf16 matmuls of this many rows or more run on AMX tiles, x rounded to bf16 (linear_amx.c); 0: none.
        self.amx_rows = _fn(lib.fleet_amx_rows)()
        # int8/int4 matmuls of this many rows or more run there too, x and w as bf16 hi + lo; 0: none.
        split_rows = _fn(lib.fleet_amx_split_rows, ctypes.c_int)
        self.amx_split_rows = {f: split_rows(_LINEAR_FORMATS[f]) for f in ("int8", "int4")}
        # W8A8 calls of this many rows or more, x with one scale a row, run on AMX-INT8 tiles; 0: none.
        self.amx_w8a8_rows = _fn(lib.fleet_amx_w8a8_rows)()
        self._decode = _fn(lib.fleet_paged_decode_f32, _P, _I64, _P, _P, _P, _I64, _P, _I64, _I64, _I64, _I64,
                           _I64, ctypes.c_float, _P, ctypes.c_int)
        self._add_rms_norm = _fn(lib.fleet_add_rms_norm_f32, _P, _P, _P, _P, _I64, _I64, ctypes.c_float, ctypes.c_int)
        self._rope = _fn(lib.fleet_rope_f32, _P, _I64, _P, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _I64,
                         ctypes.c_int)
        self._silu_mul = _fn(lib.fleet_silu_mul_f32, _P, _P, _I64, _I64, ctypes.c_int)
        self._prefill = _fn(lib.fleet_paged_prefill_f32, _P, _I64, _P, _P, _P, _I64, _P, _I64, _I64, _I64, _I64,
                            _I64, ctypes.c_float, _P, ctypes.c_int)
        self._vectorized = {"decode": _fn(lib.fleet_paged_decode_vectorized, _I64, _I64, _I64, _I64),
                            "prefill": _fn(lib.fleet_paged_prefill_vectorized, _I64, _I64, _I64, _I64)}
        self._linear = _fn(lib.fleet_linear, ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _P,
                           ctypes.c_int)
        self._linear_silu_mul = _fn(lib.fleet_linear_silu_mul, _P, _I64, _I64, _I64, _P, _P, _P, ctypes.c_int)
        self._linear_supported = _fn(lib.fleet_linear_supported, ctypes.c_int)
        self._linear_tuning = _fn(lib.fleet_linear_tuning, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
        self._decode_tuning = _fn(lib.fleet_paged_decode_tuning, ctypes.c_int, ctypes.c_int)
        self._digit_tuning = _fn(lib.fleet_digit_tuning, ctypes.c_int)
        self._digits_take = _fn(lib.fleet_digits_take, ctypes.c_int, _I64, _I64)
        self._int4_quads = _fn(lib.fleet_int4_quads, _I64, _I64)
        self._quads_prefetch = _fn(lib.fleet_quads_prefetch, ctypes.c_int)
        self._quads_split = _fn(lib.fleet_quads_split, ctypes.c_int)
        self._codes_halves = _fn(lib.fleet_codes_halves, ctypes.c_int)
        self._int8_lay = _fn(lib.fleet_int8_lay, _P, _I64, _I64, _P, _P)
        self._int8_laid = _fn(lib.fleet_linear_int8_laid, _P, _I64, _I64, _I64, _P, _P, _P, _P, ctypes.c_int)
        self._w8a8 = _fn(lib.fleet_linear_w8a8, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _P, ctypes.c_int)
        self._w8a8_supported = _fn(lib.fleet_linear_w8a8_supported)
        # The LM head's bf16 screen (greedy_head.c; kernels.cpu.greedy_head): "native" on
        # AVX512_BF16, "widened" (bf16 widened to float32 multiply-adds) on other AVX-512 CPUs, else None.
        self.bf16dot = {1: "native", 2: "widened"}.get(_fn(lib.fleet_bf16dot_supported)())
        self._bf16dot = _fn(lib.fleet_bf16dot, _P, _I64, _I64, _I64, _P, _P, _P, ctypes.c_int)
        self._bf16dot_tuning = _fn(lib.fleet_bf16dot_tuning, ctypes.c_int)
        self._candidates = _fn(lib.fleet_head_candidates, _P, _I64, _I64, _P, _P, ctypes.c_float, ctypes.c_double,
                               _I64, _P, _P, ctypes.c_int)
        self._head_xnorm = _fn(lib.fleet_head_xnorm, _P, _I64, _I64, ctypes.c_double, _P)
        self._head_argmax = _fn(lib.fleet_head_argmax, _P, _I64, _I64, _P, _I64, _P, ctypes.c_float, ctypes.c_double,
                                ctypes.c_double, _I64, _I64, _P, _P, _P, _P, _P, ctypes.c_int)

    def vectorized(self, heads: int, kv_heads: int, head_dim: int, block_size: int, op: str = "decode") -> bool:
        """Whether the SIMD path (rather than the portable loops) of ``op`` ("decode" or
        "prefill") serves this shape."""
        return bool(self._vectorized[op](heads, kv_heads, head_dim, block_size))

    def paged_decode(
        self,
        q: torch.Tensor,             # [n, heads, head_dim] float32, heads dense (rows may be strided)
        k_cache: torch.Tensor,       # [num_blocks, block_size, kv_heads, head_dim] float32, contiguous
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [n, >= blocks of the longest] int64, rows contiguous
        seq_lens: torch.Tensor,      # [n] int64: context length, new token included (already stored)
        scale: float,
        out: torch.Tensor,           # [n, heads, head_dim] float32, contiguous; written
    ) -> torch.Tensor:
        n, heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        self._check_attention("paged_decode", q, k_cache, v_cache, block_tables, out)
        _check("paged_decode", seq_lens.dtype == torch.int64 and seq_lens.device.type == "cpu"
               and block_tables.shape[0] == n == seq_lens.shape[0] and seq_lens.is_contiguous(),
               "int64 seq_lens [n] beside block_tables [n, max_blocks]")
        rc = self._decode(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                          block_tables.stride(0), seq_lens.data_ptr(), n, heads, kv_heads, head_dim,
                          block_size, scale, out.data_ptr(), torch.get_num_threads())
        _check("paged_decode", rc == 0, f"a shape the kernel serves (code {rc})")
        return out

    def paged_prefill(
        self,
        q: torch.Tensor,             # [num_tokens, heads, head_dim] float32, heads dense (rows may be strided)
        k_cache: torch.Tensor,       # [num_blocks, block_size, kv_heads, head_dim] float32, contiguous
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [n, >= blocks of the longest context] int64, rows contiguous
        chunks: torch.Tensor,        # [n, 3] int64: first row in q, rows, context length (rows included)
        scale: float,
        out: torch.Tensor,           # [num_tokens, heads, head_dim] float32, contiguous; chunk rows written
    ) -> torch.Tensor:
        """Causal attention of n prefill chunks over their paged context (new K/V already stored):
        row i of a chunk is at position ctx - rows + i and sees keys 0..that position."""
        self._check_attention("paged_prefill", q, k_cache, v_cache, block_tables, out)
        n = block_tables.shape[0]
        _check("paged_prefill", chunks.dtype == torch.int64 and chunks.shape == (n, 3) and chunks.is_contiguous()
               and chunks.device.type == "cpu", "int64 chunks [n, 3] beside block_tables [n, max_blocks]")
        if n:
            first, rows, ctx = chunks[:, 0], chunks[:, 1], chunks[:, 2]
            blocks = -(-ctx // k_cache.shape[1])
            _check("paged_prefill", bool(((first >= 0) & (rows >= 0) & (ctx >= rows) & (first + rows <= q.shape[0])
                                          & (blocks <= block_tables.shape[1])).all()),
                   "chunks within q whose contexts fit their block tables")
        rc = self._prefill(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                           block_tables.stride(0), chunks.data_ptr(), n, q.shape[1], k_cache.shape[2], q.shape[2],
                           k_cache.shape[1], scale, out.data_ptr(), torch.get_num_threads())
        _check("paged_prefill", rc == 0, f"a shape the kernel serves (code {rc})")
        return out

    @staticmethod
    def _check_attention(op: str, q, k_cache, v_cache, block_tables, out) -> None:
        """What both attention kernels need of q, the caches, the tables and out."""
        head_dim = q.shape[2]
        cache_dim, kv_heads = k_cache.shape[3], k_cache.shape[2]
        _check(op, q.dtype == k_cache.dtype == v_cache.dtype == out.dtype == torch.float32, "float32 tensors")
        _check(op, all(t.device.type == "cpu" for t in (q, k_cache, v_cache, out, block_tables)), "CPU tensors")
        _check(op, q.stride(2) == 1 and q.stride(1) == head_dim and out.is_contiguous() and k_cache.is_contiguous()
               and v_cache.is_contiguous(), "dense q heads, contiguous out and caches")
        _check(op, out.shape == q.shape and v_cache.shape == k_cache.shape and cache_dim == head_dim
               and q.shape[1] % kv_heads == 0, "matching shapes")
        _check(op, block_tables.dtype == torch.int64 and block_tables.dim() == 2 and block_tables.stride(1) == 1,
               "int64 block_tables [n, max_blocks]")

    # -- the glue between matmuls (glue.c) --------------------------------------------------
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float, out: torch.Tensor) -> None:
        """residual += x (if given); out = rms_norm(residual or x) * weight. [n, h] float32, contiguous."""
        tensors = (x, weight, out) if residual is None else (x, weight, out, residual)
        _check("add_rms_norm", _f32_dense(*tensors) and x.dim() == 2 and weight.shape == x.shape[1:] and out.shape == x.shape
               and (residual is None or residual.shape == x.shape), "float32 CPU [n, h] x, out, residual and [h] weight")
        n, h = x.shape
        self._add_rms_norm(x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
                           out.data_ptr(), n, h, eps, torch.get_num_threads())

    def rope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
             sin_table: torch.Tensor) -> None:
        """Rotate-half RoPE in place: q [n, H, D], k [n, KVH, D] (row-strided, heads dense);
        tables [max_pos, D] float32 with repeated halves; positions [n] int64, within the tables."""
        n, heads, d = q.shape
        _check("rope", q.dtype == k.dtype == cos_table.dtype == sin_table.dtype == torch.float32
               and all(t.device.type == "cpu" for t in (q, k, positions, cos_table, sin_table))
               and k.dim() == 3 and k.shape[0] == n and k.shape[2] == d and d % 2 == 0
               and q.stride(2) == k.stride(2) == 1 and q.stride(1) == k.stride(1) == d
               and cos_table.dim() == 2 and cos_table.shape[1] == d and cos_table.stride(1) == 1
               and sin_table.shape == cos_table.shape and sin_table.stride() == cos_table.stride()
               and positions.dtype == torch.int64 and positions.shape == (n,) and positions.is_contiguous(),
               "float32 CPU q/k with dense heads, [max_pos, head_dim] tables and int64 positions [n]")
        self._rope(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), n, heads, k.shape[1], d,
                   positions.data_ptr(), cos_table.data_ptr(), sin_table.data_ptr(), cos_table.stride(0),
                   torch.get_num_threads())

    def silu_and_mul(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """out [n, I] = silu(x[:, :I]) * x[:, I:]; x [n, 2I] float32, contiguous."""
        _check("silu_and_mul", _f32_dense(x, out) and x.dim() == out.dim() == 2 and x.shape[0] == out.shape[0]
               and x.shape[1] == 2 * out.shape[1], "float32 CPU contiguous x [n, 2I] and out [n, I]")
        self._silu_mul(x.data_ptr(), out.data_ptr(), x.shape[0], out.shape[1], torch.get_num_threads())


    # -- matmuls over packed weights (linear.c; the API and the checks are in linear.py) ----
    def linear_supported(self, fmt: int) -> bool:
        """Whether the kernel for format ``fmt`` (an index into linear.FORMATS) runs here."""
        return bool(self._linear_supported(fmt))

    def linear_tuning(self, prefetch_far: bool | None, f32_pairs: bool | None,
                      wide_prefetch: bool | None = None, one_row_prefetch: bool | None = None,
                      codes_halves: bool | None = None) -> dict[str, bool]:
        """Sets the matmuls' speed tunings where not None (linear.c); returns them as they are then."""
        knobs = (prefetch_far, f32_pairs, wide_prefetch, one_row_prefetch)
        code = self._linear_tuning(*(-2 if v is None else int(v) for v in knobs))
        halves = self._codes_halves(-1 if codes_halves is None else int(codes_halves))
        return {"prefetch_far": bool(code & 1), "f32_pairs": bool(code & 2), "wide_prefetch": bool(code & 4),
                "one_row_prefetch": bool(code & 8), "codes_halves": bool(halves)}

    def digit_rows(self, rows: int | None = None) -> int:
        """Sets from how many rows per-channel int8 and grouped int4 calls take the two-byte
        integer path (linear_digits.c: AVX512_VNNI, no AMX; 0: never), where not None; returns
        it as it is then (0 where that path does not run here). Results change with it: x is
        rounded to 16 bits a group of 64 (32 for int4 in groups of 32) there."""
        if rows is not None and rows < 0:
            raise ValueError("rows must be >= 0")
        return int(self._digit_tuning(-1 if rows is None else rows))

    def digit_group(self, fmt: str, k: int, group: int, quads: bool = False) -> int:
        """x's group on the two-byte path for a linear() weight of format ``fmt`` (``int8`` with
        ``group`` = k for per channel; ``int4``, packed as quads or not), K = ``k``: 64, 32 for
        int4 in groups of 32, or 0 where the path does not take it (``fleet_digits_take``,
        wherever that path runs; int4 in k pairs never)."""
        return int(self._digits_take(INT4_QUADS if quads else _LINEAR_FORMATS[fmt], k, group))

    def int4_quads(self, k: int, group: int) -> int:
        """Whether int4 weights of K = ``k`` in groups of ``group`` are packed as quads in this
        process (AVX512_VNNI, no AMX, a group a multiple of 32; ``fleet_int4_quads``): x's group
        on their path (64, or 32 for groups of 32), else 0."""
        return int(self._int4_quads(k, group))

    def quads_prefetch(self, nbytes: int | None = None) -> int:
        """Sets how far ahead calls over int4 quads that split nibbles in registers prefetch
        (bytes, rounded down to 64; 0: not at all; -1: this CPU's default) where not None;
        returns it as it is then (0 where quads do not run). Results do not change."""
        if nbytes is not None and nbytes < -1:
            raise ValueError("nbytes must be >= -1")
        return int(self._quads_prefetch(-2 if nbytes is None else nbytes))

    def quads_split(self, rows: int | None = None) -> int:
        """Sets from how many rows calls over int4 quads split each tile's nibbles into a
        buffer once (0: never, always in registers; -1: this CPU's default) where not None;
        returns it as it is then (0 where quads do not run). Results do not change."""
        if rows is not None and rows < -1:
            raise ValueError("rows must be >= -1")
        return int(self._quads_split(-2 if rows is None else rows))

    def decode_tuning(self, prefetch_tiles: int | None = None, prefetch_l2: bool | None = None) -> dict:
        """Sets decode attention's prefetch where not None (paged_decode.c: how many tiles of 16
        tokens ahead, 0 for none; into L2 or L1); returns it as it is then. Results do not change."""
        if prefetch_tiles is not None and not 0 <= prefetch_tiles <= 64:
            raise ValueError("prefetch_tiles must be 0-64")
        code = self._decode_tuning(-1 if prefetch_tiles is None else prefetch_tiles,
                                   -1 if prefetch_l2 is None else int(prefetch_l2))
        return {"prefetch_tiles": code & 0xFF, "prefetch_l2": bool(code >> 8)}

    def linear(self, x: torch.Tensor, w, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        """out [M, N] = x [M, K] W^T (+ bias) for a checked linear.PackedWeight ``w``."""
        rc = self._linear(linear_code(w), x.data_ptr(), x.shape[0], w.n, w.k, w.group, w.data.data_ptr(),
                          0 if w.scales is None else w.scales.data_ptr(), 0 if w.mins is None else w.mins.data_ptr(),
                          0 if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads())
        _check("linear", rc == 0, f"a format and group the kernel serves (code {rc})")

    def int8_lay(self, w) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A per-channel int8 linear.PackedWeight's codes laid out once as the two-byte path's
        integer dot products read them (linear_digits.c: codes [N/32, K/4, 32, 4], offsets
        [N/32, K/64, 32]); None where that path does not run here (AVX512_VNNI without AMX, K a
        multiple of 64)."""
        if w.fmt != "int8" or w.group != w.k:
            return None
        tiles = -(-w.n // 32)
        codes = torch.empty(tiles * w.k * 32, dtype=torch.int8)
        comp = torch.empty(tiles * max(w.k // 64, 1) * 32, dtype=torch.int32)
        if self._int8_lay(w.data.data_ptr(), w.n, w.k, codes.data_ptr(), comp.data_ptr()):
            return None
        return codes, comp

    def linear_int8_laid(self, x: torch.Tensor, laid: tuple[torch.Tensor, torch.Tensor], w, out: torch.Tensor) -> None:
        """out [M, N] = x [M, K] W^T through :meth:`int8_lay`'s codes of ``w`` (x as two bytes a
        value, integer sums: linear_digits.c); checked by the caller."""
        rc = self._int8_laid(x.data_ptr(), x.shape[0], w.n, w.k, laid[0].data_ptr(), laid[1].data_ptr(),
                             w.scales.data_ptr(), out.data_ptr(), torch.get_num_threads())
        _check("linear_int8_laid", rc == 0, f"AVX512_VNNI, K a multiple of 64, scratch memory (code {rc})")

    def linear_silu_mul(self, x: torch.Tensor, w, bias: torch.Tensor | None, out: torch.Tensor) -> bool:
        """out [M, N / 2] = silu(y[:, :N / 2]) * y[:, N / 2:], y = x W^T (+ bias), for a checked
        f32 linear.PackedWeight ``w``; False (nothing written) where the fused kernel does not
        serve the call (linear.c: f32, more than 8 rows, N / 2 a multiple of 32, AVX-512)."""
        rc = self._linear_silu_mul(x.data_ptr(), x.shape[0], w.n, w.k, w.data.data_ptr(),
                                   0 if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads())
        _check("linear_silu_mul", rc in (0, 1), f"scratch memory (code {rc})")
        return rc == 0

    def linear_w8a8_supported(self) -> bool:
        """Whether the W8A8 kernel (AVX512_VNNI, or AVX2) runs here."""
        return bool(self._w8a8_supported())

    def linear_w8a8(self, x: torch.Tensor, w, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        """out [M, N] = quantize_rows(x, w.group) [M, K] W^T (+ bias) for a checked linear.pack_w8a8 weight ``w``."""
        rc = self._w8a8(x.data_ptr(), x.shape[0], w.n, w.k, w.group, w.data.data_ptr(), w.scales.data_ptr(),
                        w.mins.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                        torch.get_num_threads())
        _check("linear_w8a8", rc == 0, f"K and the group multiples of 16, the group dividing K (code {rc})")

    # -- the LM head's bf16 screen (greedy_head.c; the API and the checks: greedy_head.py) --
    def bf16_dot(self, x: torch.Tensor, w: torch.Tensor, n: int, xpairs: torch.Tensor, out: torch.Tensor) -> None:
        """out [M, n] = bf16(x) [M, K] . w, w packed by greedy_head.pack_pairs; checked by the caller."""
        rc = self._bf16dot(x.data_ptr(), x.shape[0], n, x.shape[1], w.data_ptr(), xpairs.data_ptr(), out.data_ptr(),
                           torch.get_num_threads())
        _check("bf16_dot", rc == 0, f"AVX-512 and an even K (code {rc})")

    def bf16_dot_tuning(self, amx_rows: int | None = None) -> int:
        """Sets from how many rows the screen takes the AMX tiles, where not None (0: never; it
        does only where the CPU has AMX); returns it as it is then. Results are within the same bound."""
        if amx_rows is not None and amx_rows < 0:
            raise ValueError("amx_rows must be >= 0")
        return int(self._bf16dot_tuning(-1 if amx_rows is None else amx_rows))

    def head_candidates(self, approx: torch.Tensor, xnorm: torch.Tensor, wnorm: torch.Tensor, wmax: float,
                        c: float, idx: torch.Tensor, count: torch.Tensor) -> bool:
        """Each row's candidates into idx [M, cap] / count [M] (greedy_head.c); False when a row
        has more than cap of them or a value that is not finite."""
        rc = self._candidates(approx.data_ptr(), approx.shape[0], approx.shape[1], xnorm.data_ptr(), wnorm.data_ptr(),
                              wmax, c, idx.shape[1], idx.data_ptr(), count.data_ptr(), torch.get_num_threads())
        return rc == 0   # the kernel runs on every build (greedy_head.c): 0 or 1

    def head_xnorm(self, x: torch.Tensor, min_norm: float, out: torch.Tensor) -> bool:
        """|x| of each row of x [M, K] (float32, contiguous), in double, times 1 + 2^-20, into out
        [M] float32 (greedy_head.c); False where a row is not finite or its |x| is below min_norm."""
        return self._head_xnorm(x.data_ptr(), x.shape[0], x.shape[1], min_norm, out.data_ptr()) == 0

    def head_argmax(self, x: torch.Tensor, approx: torch.Tensor, wbound: torch.Tensor, wmax: float, c: float,
                    min_norm: float, max_union: int, w: torch.Tensor, bufs: dict[str, torch.Tensor]) -> bool:
        """Each row's greedy token into bufs["tokens"] from the screen's approx [M, N] (greedy_head.c's
        fleet_head_argmax: |x|, the candidates, the exact fp32 logits of their union over w [N, K]);
        False where the screen cannot decide. Checked by the caller (greedy_head.py)."""
        m, k = x.shape
        rc = self._head_argmax(x.data_ptr(), m, k, approx.data_ptr(), approx.shape[1], wbound.data_ptr(), wmax, c,
                               min_norm, bufs["idx"].shape[1], max_union, w.data_ptr(), bufs["idx"].data_ptr(),
                               bufs["count"].data_ptr(), bufs["xnorm"].data_ptr(), bufs["tokens"].data_ptr(),
                               torch.get_num_threads())
        _check("head_argmax", rc in (0, 1), f"scratch memory (code {rc})")
        return rc == 0


def _f32_dense(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def _fn(f, *argtypes):
    f.restype, f.argtypes = ctypes.c_int, list(argtypes)
    return f


def _check(op: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{op} needs {what}")


_process_lock = threading.Lock()
_process: list[CpuKernels | None] = []   # this process's kernels, once loaded (see process_kernels)


def default_cache_dir() -> Path:
    """Where the engine builds the kernels: ``<cache root>/cpu-kernels``, the cache root being
    ``$FLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/redis-llm-fleet``, else
    ``~/.cache/redis-llm-fleet`` (the rule of ``gpu_worker.model.default_model.cache_root``,
    which this package may not import)."""
    if os.environ.get("FLEET_CACHE_DIR"):
        return Path(os.environ["FLEET_CACHE_DIR"]) / "cpu-kernels"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "redis-llm-fleet" / "cpu-kernels"


def process_kernels() -> CpuKernels | None:
    """The kernels for callers below the engine (``kernels.cpu.linear``): built into
    :func:`default_cache_dir` and loaded on first call, the same object after; None without
    a compiler."""
    if not _process:
        with _process_lock:
            if not _process:
                _process.append(load(default_cache_dir()))
    return _process[0]


def load(cache_dir: Path) -> CpuKernels | None:
    """Build (once) and load the kernels; None when there is no working C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        logger.info("CPU kernels: no C compiler found; using the torch path")
        return None
    try:
        path = _build(cc, Path(cache_dir))
        return CpuKernels(path)
    except (OSError, AttributeError, subprocess.SubprocessError) as e:
        logger.warning("CPU kernels: build or load failed (%s); using the torch path", e)
        return None


def _build(cc: str, cache_dir: Path) -> Path:
    here = Path(__file__).parent
    sources = [here / name for name in SOURCES]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    for part in (*(here.joinpath(f).read_bytes() for f in SOURCES + HEADERS), " ".join(FLAGS).encode(), version.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        key.update(part)
    target = cache_dir / f"fleet_cpu_{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, *map(str, sources), "-o", tmp, "-lm"],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise OSError(f"{cc} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)   # atomic: concurrent builders publish the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("CPU kernels built: %s", target)
    return target


def _cpu_flags() -> str:
    """The CPU's flags for the build key (sorted), or what ``platform`` knows where there are none."""
    return " ".join(sorted(cpuinfo.flags())) or platform.processor()

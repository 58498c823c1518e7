"""A decode step's decoder layers in one C call (``decode_layers.c``).

:class:`DecodeLayers` holds, for each layer of a Llama-family model, its two RMSNorm weights
and its four projections as :class:`~kernels.cpu.linear.PackedWeight` (q/k/v fused, gate/up
fused, each with an optional bias), checked once; :meth:`DecodeLayers.run` then runs a range
of layers over rows that each feed one new token, storing their K/V into the paged caches
and attending over them, in one ctypes call. It computes exactly what the per-op path does
(glue.c, linear.c, paged_decode.c called one by one), without its per-op Python.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu import _f32_dense, linear_code, process_kernels
from kernels.cpu.linear import FORMATS, PackedWeight, supported

_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
CODES = {**{f: i for i, f in enumerate(FORMATS)}, "w8a8": len(FORMATS)}   # decode_layers.c's format codes


class _Weight(ctypes.Structure):
    _fields_ = [("fmt", _I64), ("n", _I64), ("k", _I64), ("group", _I64), ("data", _P), ("scales", _P),
                ("mins", _P), ("bias", _P), ("input_scale", _P)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight),
                ("down", _Weight), ("k_cache", _P), ("v_cache", _P)]


class _Step(ctypes.Structure):
    _fields_ = [(name, _I64) for name in ("rows", "hidden", "heads", "kv_heads", "head_dim", "inter",
                                          "block_size", "table_stride", "rope_stride")] + [
        ("eps", _F), ("scale", _F), ("positions", _P), ("slots", _P), ("tables", _P), ("lens", _P),
        ("cos_table", _P), ("sin_table", _P)]


@dataclass(frozen=True)
class Projection:
    """y = (x / input_scale) W^T (+ bias): a packed weight [N, K] and optional float32 [N] bias, [K] input scale."""
    weight: PackedWeight
    bias: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights, each projection a :class:`Projection`."""
    input_norm: torch.Tensor     # [hidden] float32
    post_norm: torch.Tensor
    qkv: Projection       # [(heads + 2 kv_heads) head_dim, hidden]
    o: Projection         # [hidden, heads head_dim]
    gate_up: Projection   # [2 inter, hidden]
    down: Projection      # [hidden, inter]


def _f32(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    return _f32_dense(t) and tuple(t.shape) == shape


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _weight(p: Projection, n: int, k: int, what: str) -> _Weight:
    w = p.weight
    if w.fmt not in CODES or (w.n, w.k) != (n, k):
        raise ValueError(f"{what} must be a packed {tuple(CODES)} [{n}, {k}] weight, got {w.fmt} [{w.n}, {w.k}]")
    if p.bias is not None and not _f32(p.bias, (n,)):
        raise ValueError(f"{what}'s bias must be a contiguous float32 [{n}] tensor")
    if p.input_scale is not None and not _f32(p.input_scale, (k,)):
        raise ValueError(f"{what}'s input scale must be a contiguous float32 [{k}] tensor")
    code = CODES["w8a8"] if w.fmt == "w8a8" else linear_code(w)
    return _Weight(code, w.n, w.k, w.group, w.data.data_ptr(), _ptr(w.scales), _ptr(w.mins), _ptr(p.bias),
                   _ptr(p.input_scale))


def available(formats: set[str]) -> bool:
    """The kernels built and every format in ``formats`` has its fast path on this CPU."""
    return process_kernels() is not None and all(supported(f) for f in formats)


class DecodeLayers:
    """The layers of one model for :meth:`run` (ValueError for weights it does not take)."""

    def __init__(self, layers: list[LayerWeights], heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        if not layers or heads % kv_heads:
            raise ValueError("DecodeLayers needs at least one layer and heads a multiple of kv_heads")
        hidden, inter = layers[0].o.weight.n, layers[0].down.weight.k
        self.shape = (hidden, heads, kv_heads, head_dim, inter)
        self.eps, self.num_layers = float(eps), len(layers)
        self._weights = layers                      # keeps every pointer below alive
        self._layers = (_Layer * len(layers))()
        for i, lw in enumerate(layers):
            if not (_f32(lw.input_norm, (hidden,)) and _f32(lw.post_norm, (hidden,))):
                raise ValueError(f"layer {i}: norms must be contiguous float32 [{hidden}] tensors")
            self._layers[i] = _Layer(lw.input_norm.data_ptr(), lw.post_norm.data_ptr(),
                                     _weight(lw.qkv, (heads + 2 * kv_heads) * head_dim, hidden, "qkv"),
                                     _weight(lw.o, hidden, heads * head_dim, "o"),
                                     _weight(lw.gate_up, 2 * inter, hidden, "gate_up"),
                                     _weight(lw.down, hidden, inter, "down"), 0, 0)
        self.formats = {p.weight.fmt for lw in layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)}
        lib = ctypes.CDLL(str(process_kernels().path))
        self._run = lib.fleet_decode_layers
        self._run.restype, self._run.argtypes = ctypes.c_int, [_P, _I64, _P, _P, _P, ctypes.c_int, _P, ctypes.c_int]
        self._scratch = lib.fleet_decode_scratch
        self._scratch.restype, self._scratch.argtypes = _I64, [_P]

    def run(self, x: torch.Tensor, residual: torch.Tensor, first: bool, kv_caches, start: int,
            positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, lens: torch.Tensor, block_size: int, scale: float) -> None:
        """Layers [start, start + len(kv_caches)) over x [n, hidden] (overwritten with the last
        layer's output) and residual [n, hidden] (when ``first``, empty: layer ``start``
        fills it); positions, slots, lens [n] int64; tables [n, *] int64; the caches [blocks,
        block_size, kv_heads, head_dim] float32, one (k, v) pair per layer."""
        hidden, heads, kv_heads, head_dim, inter = self.shape
        n, end = x.shape[0], start + len(kv_caches)
        if not (0 <= start < end <= self.num_layers and _f32(x, (n, hidden)) and _f32(residual, (n, hidden))):
            raise ValueError("DecodeLayers.run needs contiguous float32 x and residual [n, hidden] and a layer range")
        for t in (positions, slots, lens, tables):
            if t.dtype != torch.int64 or t.shape[0] != n or not t.is_contiguous():
                raise ValueError("positions, slots, lens and tables must be contiguous int64 with n rows")
        if cos_table.dtype != torch.float32 or cos_table.shape[1] != head_dim or sin_table.stride() != cos_table.stride():
            raise ValueError(f"RoPE tables must be float32 [*, {head_dim}] with one layout")
        cache_shape = (kv_caches[0][0].shape[0], block_size, kv_heads, head_dim)
        if n and not (0 <= int(slots.min()) and int(slots.max()) < cache_shape[0] * block_size):
            raise ValueError("a slot outside the KV cache")
        for i, (k, v) in enumerate(kv_caches):
            if not (_f32(k, cache_shape) and _f32(v, cache_shape)):
                raise ValueError(f"KV caches must be contiguous float32 {cache_shape}")
            self._layers[start + i].k_cache, self._layers[start + i].v_cache = k.data_ptr(), v.data_ptr()
        step = _Step(n, hidden, heads, kv_heads, head_dim, inter, block_size, tables.shape[1], cos_table.stride(0),
                     self.eps, scale, positions.data_ptr(), slots.data_ptr(), tables.data_ptr(), lens.data_ptr(),
                     cos_table.data_ptr(), sin_table.data_ptr())
        scratch = torch.empty(self._scratch(ctypes.byref(step)), dtype=torch.float32)
        rc = self._run(ctypes.addressof(self._layers[start]), end - start, ctypes.byref(step), x.data_ptr(),
                       residual.data_ptr(), int(first), scratch.data_ptr(), torch.get_num_threads())
        if rc:
            raise RuntimeError(f"fleet_decode_layers failed (code {rc}) after its inputs were checked")

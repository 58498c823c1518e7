"""Projections served by the packed-weight CPU kernels (``kernels/cpu/linear.c``).

A :class:`CpuPackedLinear` holds one ``kernels.cpu.linear.PackedWeight`` (f32, bf16, int8,
int4 or W8A8 tiles, packed once at load) and computes ``y = (x / input_scale) W^T (+ b)`` in float32:
the kernels read the small weights directly and dequantize in registers, so int8 streams a
quarter of fp32's bytes and bf16 half. Activations, bias and input scale stay float32 (but
for the AMX tiles: bf16 calls of many rows round x to bf16 there, ``linear_amx.c``).

Where a format's kernel does not run on this CPU (``supported(fmt)`` false: neither AVX-512
nor AVX2, or the C kernels did not build), the callers keep their previous path instead of packing, and
:func:`kernel_runs` says so once per format in the log.
"""
from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

from kernels import cpuinfo
from kernels.cpu import greedy_head
from kernels.cpu import linear as packed_linear
from gpu_worker.cpu_tuning import HugePageArena, huge_pages_pay, release_free_heap
from gpu_worker.model.ops.base import Linear

logger = logging.getLogger(__name__)

_reported: set[str] = set()    # formats whose missing kernel was logged
_described: set[str] = set()   # formats whose instructions were logged


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it does not exist)."""
    return cpuinfo.flags()


def cpu_vendor() -> str:
    """The CPU's vendor_id ("AuthenticAMD", "GenuineIntel"; "" where unknown)."""
    return cpuinfo.vendor()


def kernel_runs(fmt: str, instead: str) -> bool:
    """Whether the packed ``fmt`` kernel runs on this CPU; when it does not, log once (per
    format) which instructions it needs, which of them this CPU has, and ``instead``: what
    the engine uses in its place."""
    if packed_linear.supported(fmt):
        return True
    if fmt not in _reported:
        _reported.add(fmt)
        flags = cpu_flags()
        have = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni") if f in flags]
        need = "AVX512_VNNI or AVX2" if fmt == "w8a8" else "AVX-512 F/BW or AVX2 with FMA and F16C"
        logger.warning("packed %s weights: the kernel does not run here (it needs the C kernels built and %s; "
                       "this CPU has %s); %s", fmt, need, ", ".join(have) or "none of them", instead)
    return False


def report_instructions(model: nn.Module) -> list[str]:
    """Say in the log, once per format and process, what computes the packed projections of
    ``model`` on this CPU (``kernels.cpu.linear.instructions``: the vector instructions, AMX
    from some row count, or the torch reference); returns the formats it found."""
    fmts = sorted({m.packed.fmt for m in model.modules() if isinstance(m, CpuPackedLinear)})
    for fmt in fmts:
        if fmt not in _described:
            _described.add(fmt)
            logger.info("CPU matmuls over %s weights: %s", fmt, packed_linear.instructions(fmt))
    return fmts


class CpuPackedLinear(nn.Module):
    """y = (x / input_scale) W^T (+ b) over a packed weight; x [n, in] float32 -> [n, out] float32.

    ``weight`` dequantizes a dense float32 copy on demand (``input_scale`` folded in), so
    code that reads ``.weight`` (quantizing a copy of a packed model) sees the layer it computes.
    """

    def __init__(self, packed: packed_linear.PackedWeight, bias: torch.Tensor | None = None,
                 input_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.packed = packed
        self.out_features, self.in_features = packed.n, packed.k
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        self.register_buffer("input_scale", None if input_scale is None else input_scale.detach().float().clone())

    @classmethod
    def dense(cls, weight: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> CpuPackedLinear:
        """A float weight [out, in] packed as ``f32`` or ``bf16``."""
        pack = {"f32": packed_linear.pack_f32, "bf16": packed_linear.pack_bf16}[fmt]
        return cls(pack(weight), bias)

    @property
    def fmt(self) -> str:
        return self.packed.fmt

    @property
    def packed_bytes(self) -> int:
        """Bytes of the packed weight (tiles, scales, minima; tile padding included)."""
        parts = (self.packed.data, self.packed.scales, self.packed.mins)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def weight(self) -> torch.Tensor:  # [out, in] float32
        w = packed_linear.dequantize(self.packed)
        return w if self.input_scale is None else w / self.input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out] float32
        if self.input_scale is not None:
            x = x / self.input_scale
        x = x.float().contiguous()
        if x.shape[0] == 0:
            return x.new_empty(0, self.out_features)
        if self.packed.fmt == "w8a8":   # x quantized to int8 per row or group (--quantization w8a8[-a<G>])
            return packed_linear.linear_w8a8(x, self.packed, self.bias)
        return packed_linear.linear(x, self.packed, self.bias)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this gate/up projection's output ([n, out / 2]) in one fused kernel
        call (``linear.linear_silu_mul``: the same bits as ``forward`` then the ``cpu``
        backend's silu_and_mul); None where that kernel does not serve x (take the two steps)."""
        if self.input_scale is not None or x.dtype != torch.float32 or not x.is_contiguous():
            return None
        return packed_linear.linear_silu_mul(x, self.packed, self.bias)

    def __deepcopy__(self, memo: dict) -> CpuPackedLinear:
        # The packed weight is never written after load, so a copy (a self-drafter's) shares it.
        new = CpuPackedLinear(self.packed, self.bias, self.input_scale)
        memo[id(self)] = new
        return new

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
                f"group={self.packed.group}, bias={self.bias is not None}, "
                f"input_scale={self.input_scale is not None}")


def pack_dense_for_cpu(model: nn.Module, fmt: str) -> int:
    """Swap every dense ``Linear`` of a float32 CPU model for a :class:`CpuPackedLinear` of
    format ``fmt`` (``bf16``: weights rounded to bfloat16, half the bytes) and give the
    model a packed LM head (``packed_head``, a second copy of a tied embedding); in place.
    Returns how many projections were packed."""
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if type(child) is Linear]
    for parent, name, child in targets:
        setattr(parent, name, CpuPackedLinear.dense(child.weight, fmt, child.bias))
    head = getattr(model, "lm_head", None)
    if isinstance(head, torch.Tensor) and head.numel():
        model.packed_head = CpuPackedLinear.dense(head, fmt)
    logger.info("%d linear layers%s packed as %s for the CPU kernels", len(targets),
                " and the LM head" if getattr(model, "packed_head", None) is not None else "", fmt)
    return len(targets)


# Bytes moved between two returns of the old copies' heap pages (place_on_huge_pages).
TRIM_EVERY = 256 << 20


def place_on_huge_pages(model: nn.Module, shared_with: nn.Module | None = None) -> int:
    """Move the packed weights of ``model`` (every CpuPackedLinear's tiles, scales and minima;
    the greedy head's bf16 pairs and int8 codes) into one mapping on transparent huge pages
    (``cpu_tuning.HugePageArena``: why, and what it measured). Before anything keeps pointers
    to them (the fused decode layers). One weight at a time, the heap's freed pages given back
    every TRIM_EVERY bytes, so that the load's peak memory grows by that much, not by a second
    copy of the model. Weights that ``shared_with`` holds too (a self-drafter's copy of its
    target: the head, the greedy screen) stay where they are. Returns the bytes placed (0:
    none, or the platform gives no huge pages)."""
    def packed_of(m: nn.Module | None) -> list[CpuPackedLinear]:
        return [] if m is None else [x for x in m.modules() if isinstance(x, CpuPackedLinear)]

    theirs = {id(x.packed) for x in packed_of(shared_with)}
    head = getattr(model, "greedy_head", None)
    if head is not None and head is getattr(shared_with, "greedy_head", None):
        head = None
    owners = [(m, "packed") for m in packed_of(model) if id(m.packed) not in theirs]
    owners += [(head, name) for name in ("codes", "pairs") if getattr(head, name, None) is not None]

    def parts(value) -> list[torch.Tensor | None]:
        return [value] if isinstance(value, torch.Tensor) else [value.data, value.scales, value.mins]

    total = HugePageArena.size_of([t for owner, name in owners for t in parts(getattr(owner, name))])
    if not huge_pages_pay(total):
        return 0
    arena, since_trim = HugePageArena(total), 0
    for owner, name in owners:
        value = getattr(owner, name)
        if isinstance(value, torch.Tensor):
            setattr(owner, name, arena.copy(value))
        else:
            setattr(owner, name, dataclasses.replace(value, data=arena.copy(value.data),
                                                     scales=arena.copy(value.scales), mins=arena.copy(value.mins)))
        since_trim += HugePageArena.size_of(parts(value))
        del value
        if since_trim >= TRIM_EVERY:
            release_free_heap()
            since_trim = 0
    release_free_heap()
    logger.info("%.0f MB of packed weights placed on huge pages", total / 1e6)
    return total


# The widened screen (no AVX512_BF16) reads half the fp32 head's bytes but does its multiply-adds:
# in-process A/B on a 2-core Intel Xeon (family 6 model 207), SmolLM2's head with the caches
# flushed between calls, medians of 15, two runs: 0.67-0.75x the full head's time at 1 row,
# 0.64-0.70x at 4, 0.79-0.83x at 8, 0.84-0.91x at 12, level at 16. Whole decode steps of the
# engine (screen on and off in alternate steps, medians of 30): 0.95x at batch 1 and 4, 0.97x
# at 8 and 12.
WIDENED_MAX_ROWS = 12
# Without AVX-512 (AVX2: no bf16 pass) calls of up to this many rows screen over the head's int8
# codes, larger ones compute the whole head. 2-core AMD EPYC Zen 2 (family 23 model 49), the
# head alone ([49152 x 576], synthetic loud rows, alternating, medians of 9): 0.53x the full
# head's time at 1 row, 0.69x at 4 and 8, 0.76x at 16, 0.84x at 32, 0.94x at 48, 0.96x at 64;
# the throughput workload in one process (screen limits alternating, 3 runs each, the same
# tokens): head 1.55-1.61 s a run with the full head, 1.44-1.46 up to 8 rows, 1.35-1.38 up to
# 16, 1.32-1.35 up to 32 (runs 20.78-21.00 s -> 20.14-20.76).
AVX2_SCREEN_ROWS = 32
# On AMD CPUs with AVX512_BF16 (Zen 4 and later) vdpbf16ps runs at twice the float32 FMA rate,
# so the bf16 pass overtakes the int8 screen (float32 multiply-adds over a quarter of the bytes)
# from 5 rows, not past 8 as on Intel's cores (greedy_head.INT8_ROWS). 2-core AMD EPYC Zen 4
# (family 25 model 17), SmolLM2's head, caches flushed between calls, alternating, medians of
# 21, int8 / bf16 screen: 1.16 / 2.19 ms at 1 row, 1.88 / 2.12 at 4, 2.26 / 2.05 at 5, 3.09 / 2.27
# at 8; whole engine steps in one process (the limit alternating, medians of 60): fp32 batch 6
# and 8 0.97x and 0.98x the time with 4, `--quantization int8` 0.96x and 0.93x, batch 5 level.
FAST_BF16_INT8_ROWS = 4


def screen_int8_rows(mode: str | None, k: int) -> int:
    """Up to how many rows the greedy head screens over int8 codes on this CPU: AVX2_SCREEN_ROWS
    without a bf16 pass, FAST_BF16_INT8_ROWS where AMD's vdpbf16ps runs it (not the AMX tiles),
    else greedy_head.INT8_ROWS."""
    if mode is None:
        return AVX2_SCREEN_ROWS
    if mode == "native" and not greedy_head.on_amx(k) and cpu_vendor() == "AuthenticAMD":
        return FAST_BF16_INT8_ROWS
    return greedy_head.INT8_ROWS


def install_greedy_head(model: nn.Module) -> bool:
    """Give a model whose LM head is packed f32 tiles a :class:`kernels.cpu.greedy_head.GreedyHead`
    (``model.greedy_head``: greedy rows' tokens from a bf16 screen and an exact recompute of
    the few candidates, the same tokens as the full head): with AVX512_BF16 at any row count;
    on other AVX-512 CPUs (the bf16 screen widened to float32 multiply-adds) up to
    WIDENED_MAX_ROWS rows; on AVX2 CPUs (an int8 screen only) up to AVX2_SCREEN_ROWS; past
    those the full head is as fast. The log says which. Returns whether it did."""
    head, packed = getattr(model, "lm_head", None), getattr(model, "packed_head", None)
    if not isinstance(packed, CpuPackedLinear) or packed.fmt != "f32" or packed.bias is not None \
            or not isinstance(head, torch.Tensor) or head.dtype != torch.float32 or head.shape[1] % 2:
        return False
    mode = greedy_head.mode()
    if mode is None and not greedy_head.int8_available():
        logger.info("greedy rows compute the whole fp32 LM head: its screen needs the C kernels' int8 path "
                    "(AVX2 or AVX-512), which this CPU (or the build) lacks")
        return False
    max_rows = WIDENED_MAX_ROWS if mode == "widened" else None   # without AVX-512: AVX2_SCREEN_ROWS, below
    model.greedy_head = greedy_head.GreedyHead(head, packed.packed, max_rows=max_rows,
                                               int8_rows=screen_int8_rows(mode, head.shape[1]))
    if mode is None:
        logger.info("greedy steps of up to %d rows take their token from an int8 screen of the LM head and the "
                    "exact fp32 logits of its candidates; larger steps compute the whole fp32 head (the bf16 "
                    "screen needs AVX-512)", model.greedy_head.max_rows)
    elif mode == "native":
        logger.info("greedy rows take their token from a screen of the LM head (int8 codes up to %d rows, "
                    "else bf16 on %s) and the exact fp32 logits of its candidates", model.greedy_head.int8_rows,
                    "AMX tiles" if greedy_head.on_amx(head.shape[1]) else "AVX512_BF16")
    else:
        logger.info("greedy steps of up to %d rows take their token from a screen of the LM head (int8 codes up "
                    "to %d rows, else bf16 widened to float32: this CPU lacks AVX512_BF16) and the exact fp32 "
                    "logits of its candidates; larger steps compute the whole fp32 head", max_rows,
                    model.greedy_head.int8_rows)
    return True

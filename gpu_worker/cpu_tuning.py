"""Process-wide settings that make CPU inference fast.

glibc returns large freed blocks (above its mmap threshold) to the kernel at once, so every
activation tensor of a forward pass is a fresh mmap and pays a page fault per 4 KiB on first
touch. On the virtual machines measured here that made element-wise ops on 2 MiB tensors
about 10x slower (5.9 ms vs 0.6 ms for a [1024, 576] multiply). Raising the mmap and trim
thresholds keeps those blocks in the heap for reuse.

The KV cache is the other large allocation: gigabytes that decode attention reads in
scattered 16-token blocks. With 4 KiB pages every block costs TLB misses, and Linux gives
transparent huge pages only to memory that asks for them where THP is set to ``madvise``
(the usual default). :func:`zeros_on_huge_pages` asks.

The packed weights are the third: a decode step of few rows streams all of them (424 MB for
SmolLM2 in fp32), and on 4 KiB pages that stream crosses a page, hence a TLB miss and a stop
for the hardware prefetchers, every 4 KiB. A :class:`HugePageArena` holds a model's packed
weights in one mapping on huge pages (``model/ops/cpu_linear.place_on_huge_pages``).
In-process A/B on a 2-core AMD EPYC Zen 4 (family 25 model 17), SmolLM2's 120 f32
projections of a decode step (fresh copies, caches flushed, alternating, medians of 14; a
harness in /tmp): 0.91-0.92x the time at 1 row, 0.94x at 2, 0.95-0.97x at 4, 0.92x at 12,
0.98x at 34. ``EngineConfig.huge_pages`` (``FLEET_HUGE_PAGES=0``) turns both placements off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import mmap
import sys
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20       # glibc's upper bound on 64-bit
_done = False
_HUGE_PAGE = 2 << 20


def tune_allocator() -> bool:
    """Keep large freed blocks in the heap (glibc only; a no-op elsewhere). Idempotent."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        ok = False
    _done = ok
    if not ok:
        logger.info("could not tune the C allocator (not glibc?)")
    return ok


def huge_pages_pay(nbytes: int) -> bool:
    """A mapping of ``nbytes`` gets huge pages worth having: at least two, and the platform has
    the advice (``MADV_HUGEPAGE``: Linux)."""
    return nbytes >= 2 * _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE")


def _advised_mapping(nbytes: int) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # zero-filled
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:                            # THP off or unsupported: 4 KiB pages
        pass
    return buf


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor on its own anonymous mapping, advised onto transparent huge pages
    before it is first touched (where the platform has the advice; else plain memory). Its own
    mapping, not malloc's: glibc may hand out a large free chunk of its heap, already backed
    by 4 KiB pages, even for a request above its mmap threshold."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not huge_pages_pay(nbytes):
        return torch.zeros(shape, dtype=dtype)
    # The tensor keeps the mapping alive; writing it now faults every page in up front (the
    # memory is committed at start, not during the first requests).
    return torch.frombuffer(_advised_mapping(nbytes), dtype=dtype).view(shape).zero_()


def _aligned_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else -(-t.numel() * t.element_size() // 64) * 64


class HugePageArena:
    """One anonymous mapping advised onto transparent huge pages, its first byte on a huge-page
    boundary, filled front to back (64-byte aligned) with copies of tensors, so that a stream
    through them crosses no 4 KiB page. The copies keep the mapping alive."""

    def __init__(self, nbytes: int) -> None:
        self._bytes = torch.frombuffer(_advised_mapping(nbytes + _HUGE_PAGE), dtype=torch.uint8)
        self._at = -self._bytes.data_ptr() % _HUGE_PAGE
        self._end = self._at + nbytes

    @staticmethod
    def size_of(tensors: Sequence[torch.Tensor | None]) -> int:
        """The bytes :meth:`copy` takes for all of ``tensors`` (None: nothing)."""
        return sum(_aligned_bytes(t) for t in tensors)

    def copy(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """A contiguous copy of CPU tensor ``t`` (its shape and dtype) in the arena; None for None."""
        if t is None:
            return None
        n, step = t.numel() * t.element_size(), _aligned_bytes(t)
        if self._at + step > self._end:
            raise ValueError("the arena is full: size it with size_of")
        piece = self._bytes[self._at:self._at + n].view(t.dtype).view(t.shape)
        self._at += step
        return piece.copy_(t)


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the kernel (glibc's malloc_trim; False elsewhere):
    after a load whose large temporaries :func:`tune_allocator` keeps in the heap."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False

"""Which group size a layer gets: shared by the quantizers (``quantize.py``), the W8A8
smoothing (``smooth.py``) and the CPU packing (``cpu_pack.py``), so none imports another for it."""
from __future__ import annotations


def int4_group_for(in_features: int, group_size: int) -> int:
    """The group size a layer gets (INT4, and grouped INT8): group_size, or the largest
    smaller power of two that divides in_features; ValueError when even 16 does not."""
    g = group_size
    while g >= 16 and in_features % g:
        g //= 2
    if g < 16:
        raise ValueError(f"in_features {in_features} has no power-of-two group >= 16")
    return g


def activation_group_for(in_features: int, group: int | None) -> int | None:
    """The activation group W8A8 uses for a layer: ``group``, or the largest smaller power of
    two >= 16 dividing in_features; None (one scale a row) when none does or none was asked."""
    try:
        return None if group is None else int4_group_for(in_features, group)
    except ValueError:
        return None

"""Timing shared by the CPU benchmarks."""
from __future__ import annotations

import time


def mean_seconds(fn, reps: int = 5) -> float:
    """Mean wall seconds of ``fn()`` over ``reps`` back-to-back calls, after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps

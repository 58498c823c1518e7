"""Timing and device facts shared by the GPU check benchmarks.

On CUDA, time with triton.testing.do_bench (CUDA events, L2 flushed between runs, so
bandwidth figures are cold-cache). On the CPU (the --dry-run smoke mode under the Triton
interpreter) a plain wall-clock loop: its numbers only prove the code runs.
"""

import json
import platform
import time
from pathlib import Path
from typing import Callable

import torch


def time_seconds(fn: Callable[[], object], device: torch.device, *, rep_ms: int = 100) -> float:
    """Mean seconds per call of fn (after warm-up)."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms) / 1e3
    fn()
    reps = 2
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def time_cuda_graph(fn: Callable[[], object], device: torch.device) -> float | None:
    """Mean seconds per replay of fn captured in a CUDA graph; None off CUDA.

    fn must already have run once (kernels compiled); it is warmed on a side stream as
    torch.cuda.graph requires, then captured and timed by replay.
    """
    if device.type != "cuda":
        return None
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    seconds = time_seconds(graph.replay, device)
    del graph
    return seconds


def peak_copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), the practical ceiling."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_seconds(lambda: dst.copy_(src), device, rep_ms=200)
    src = dst = None
    return 2 * nbytes / seconds


def environment(device: torch.device) -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, sm_count=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def write_json(out_dir: Path, name: str, payload: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path

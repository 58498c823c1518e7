"""The process-wide CPU settings: the huge-page KV cache must be an ordinary zeroed tensor
whatever the kernel does with the advice."""
import sys

import pytest
import torch

from gpu_worker.cpu_tuning import zeros_on_huge_pages


@pytest.mark.parametrize("shape", [(3, 5), (300, 16, 3, 64)])    # below and above the 4 MiB floor
def test_zeros_on_huge_pages_is_a_zeroed_tensor(shape):
    t = zeros_on_huge_pages(shape, torch.float32)
    assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert not t.any()
    t.fill_(1.0)    # writable end to end
    assert t.sum().item() == t.numel()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_a_large_kv_cache_asks_for_huge_pages():
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off on this machine")
    t = zeros_on_huge_pages(((64 << 20) // 4,), torch.float32)  # 64 MiB
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * 4
    huge = 0
    region = None
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            region = (lo, hi) if lo < end and hi > start else None
        elif region and head == "AnonHugePages:":
            huge += int(line.split()[1]) << 10
    assert huge >= 32 << 20, f"only {huge >> 20} MiB of the tensor is on huge pages"

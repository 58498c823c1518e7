"""The process-wide CPU settings: the huge-page KV cache must be an ordinary zeroed tensor
whatever the kernel does with the advice, and packed weights moved onto huge pages the same
values, computing the same tokens."""
import mmap
import sys

import pytest
import torch

from gpu_worker import cpu_tuning
from gpu_worker.cpu_tuning import HugePageArena, huge_pages_pay, zeros_on_huge_pages


def _thp_on() -> bool:
    try:
        return "[never]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


LINUX_THP = sys.platform.startswith("linux") and _thp_on()


def huge_bytes(start: int, end: int) -> int:
    """Bytes of huge pages (smaps' AnonHugePages) in the mappings that overlap [start, end)."""
    huge, region = 0, None
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            region = (lo, hi) if lo < end and hi > start else None
        elif region and head == "AnonHugePages:":
            huge += int(line.split()[1]) << 10
    return huge


@pytest.mark.parametrize("shape", [(3, 5), (300, 16, 3, 64)])    # below and above the 4 MiB floor
def test_zeros_on_huge_pages_is_a_zeroed_tensor(shape):
    t = zeros_on_huge_pages(shape, torch.float32)
    assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert not t.any()
    t.fill_(1.0)    # writable end to end
    assert t.sum().item() == t.numel()


@pytest.mark.skipif(not LINUX_THP, reason="transparent huge pages are Linux's, and off on this machine")
def test_a_large_kv_cache_asks_for_huge_pages():
    t = zeros_on_huge_pages(((64 << 20) // 4,), torch.float32)  # 64 MiB
    huge = huge_bytes(t.data_ptr(), t.data_ptr() + t.numel() * 4)
    assert huge >= 32 << 20, f"only {huge >> 20} MiB of the tensor is on huge pages"


def _weights():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3000, 576, generator=g), None, torch.randint(-128, 127, (960, 577), dtype=torch.int8, generator=g),
            torch.randn(7, generator=g).bfloat16(), torch.randn(2000, 3, generator=g).t(), torch.empty(0, 5)]


def huge_page_copies(tensors):
    """Copies of ``tensors`` (None passes through) in one arena sized for them."""
    arena = HugePageArena(HugePageArena.size_of(tensors))
    return [arena.copy(t) for t in tensors]


def test_huge_page_copies_are_equal_contiguous_and_their_own():
    ts = _weights()
    copies = huge_page_copies(ts)
    assert copies[1] is None
    for t, c in zip(ts, copies):
        if t is None:
            continue
        assert c.shape == t.shape and c.dtype == t.dtype and c.is_contiguous()
        assert torch.equal(c, t)
        if t.numel():
            assert c.data_ptr() % 64 == 0
    assert copies[0].data_ptr() % (2 << 20) == 0   # the first on a huge-page boundary
    storages = {c.untyped_storage().data_ptr() for c in copies if c is not None}
    assert len(storages) == 1   # one mapping
    ts[0].fill_(1.0)            # copies, not views of the originals
    assert not torch.equal(copies[0], ts[0])


def test_the_arena_holds_what_it_was_sized_for_and_no_more():
    ts = [torch.randn(1000, 3), torch.arange(7, dtype=torch.int8)]
    arena = cpu_tuning.HugePageArena(cpu_tuning.HugePageArena.size_of(ts))
    copies = [arena.copy(t) for t in ts]
    assert all(torch.equal(a, b) for a, b in zip(copies, ts)) and arena.copy(None) is None
    assert copies[0].data_ptr() % (2 << 20) == 0 and copies[1].data_ptr() % 64 == 0
    with pytest.raises(ValueError, match="full"):
        arena.copy(torch.zeros(1))


def test_small_sets_are_not_worth_huge_pages():
    small = [torch.randn(4, 4), torch.randn(3, 5).t()]
    assert not huge_pages_pay(HugePageArena.size_of(small))
    assert huge_pages_pay(8 << 20) == hasattr(mmap, "MADV_HUGEPAGE")


@pytest.mark.skipif(not LINUX_THP, reason="transparent huge pages are Linux's, and off on this machine")
def test_huge_page_copies_land_on_huge_pages():
    big = [torch.randn((16 << 20) // 16, 4) for _ in range(4)]   # 4 x 16 MiB
    copies = huge_page_copies(big)
    start = copies[0].data_ptr()
    huge = huge_bytes(start, start + (64 << 20))
    assert huge >= 32 << 20, f"only {huge >> 20} MiB of 64 on huge pages"


def _engine(model_dir, **kw):
    from gpu_worker import LLM

    return LLM(model_dir, kv_cache_memory=16 << 20, max_num_batched_tokens=64, **kw)


def _packed(llm):
    from gpu_worker.model.ops.cpu_linear import CpuPackedLinear

    return [m.packed for m in llm.engine.model.modules() if isinstance(m, CpuPackedLinear)]


PROMPTS = [[5, 17, 300, 41], list(range(100, 160))]


def _greedy(llm, n=12):
    from gpu_worker import SamplingParams

    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))]


@pytest.mark.parametrize("huge_pages", [True, False])
def test_an_engine_with_its_weights_on_huge_pages_gives_the_same_tokens(tiny_llama_dir, hf_reference, monkeypatch,
                                                                        huge_pages):
    from gpu_worker.model.ops import cpu_linear

    monkeypatch.setattr(cpu_tuning, "_HUGE_PAGE", 4096)   # the tiny model's few MB count as large
    monkeypatch.setattr(cpu_linear, "TRIM_EVERY", 1)      # the heap given back after every weight
    llm = _engine(tiny_llama_dir, huge_pages=huge_pages)
    packed = [p.data for p in _packed(llm)]
    if not packed:
        pytest.skip("the packed CPU kernels do not run here")
    storages = {t.untyped_storage().data_ptr() for t in packed}
    assert len(storages) == 1 if huge_pages else len(storages) == len(packed)   # one mapping, or left as packed
    assert _greedy(llm) == [hf_reference(tiny_llama_dir, p, 12) for p in PROMPTS]


@pytest.mark.parametrize("quantization", ["int8", "int8-g32+head", "w8a8"])
def test_quantized_weights_on_huge_pages_compute_what_they_did(tiny_llama_dir, monkeypatch, quantization):
    plain = _engine(tiny_llama_dir, huge_pages=False, quantization=quantization)
    monkeypatch.setattr(cpu_tuning, "_HUGE_PAGE", 4096)
    moved = _engine(tiny_llama_dir, huge_pages=True, quantization=quantization)
    a, b = _packed(plain), _packed(moved)
    if not b:
        pytest.skip("the packed CPU kernels do not run here")
    assert len({p.data.untyped_storage().data_ptr() for p in b}) == 1
    for x, y in zip(a, b):   # the same codes, scales and minima (W8A8's code sums), now in the mapping
        assert x.fmt == y.fmt and torch.equal(x.data, y.data)
        for u, v in ((x.scales, y.scales), (x.mins, y.mins)):
            assert (u is None and v is None) or (torch.equal(u, v) and v.untyped_storage().data_ptr() in
                                                 {p.data.untyped_storage().data_ptr() for p in b})
    assert _greedy(moved, 16) == _greedy(plain, 16)

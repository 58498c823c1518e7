"""Both CPU attention paths (torch: gather + SDPA; cpu backend: the C kernels) over a step
that mixes decode rows, a whole prompt and a chunk after a cached prefix, with the slots
past every context holding NaN, as a reused block may: outputs stay finite and agree."""
import pytest
import torch

from gpu_worker.bench.cpu_attention import step_metadata
from gpu_worker.model.attention import cpu_paged_attention, plan_cpu_attention, plan_native_attention
from gpu_worker.model.ops.cpu_native import loaded_kernels

PLANS = [plan_cpu_attention] + ([plan_native_attention] if loaded_kernels() is not None else [])


@pytest.mark.parametrize("plan_fn", PLANS, ids=lambda f: f.__name__)
def test_stale_slots_past_each_context_do_not_leak(plan_fn):
    seq_lens, query_lens = [7, 30, 41, 20, 70], [1, 1, 1, 20, 5]
    meta, num_blocks = step_metadata(seq_lens, query_lens, 16, seed=3)
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, 16, 2, 16)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    for row, n in enumerate(seq_lens):      # every slot past the context: NaN
        for p in range(n, meta.block_tables.shape[1] * 16):
            block = int(meta.block_tables[row, p // 16])
            if p // 16 < -(-n // 16):
                k_cache[block, p % 16] = float("nan")
                v_cache[block, p % 16] = float("nan")
    qkv = torch.randn(sum(query_lens), 8, 16, generator=gen)
    q, k, v = qkv.split([4, 2, 2], dim=1)
    out = cpu_paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), plan_fn(meta), 0.25)
    assert torch.isfinite(out).all()
    reference = cpu_paged_attention(q, k, v, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0),
                                    plan_cpu_attention(meta), 0.25)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)

"""The shortcuts of a small decode step give what the general paths give: NumPy argmax for
greedy rows, the decode-only attention plan (no prefill rows, tables sliced once), and short
chunks planned as decode rows."""
from __future__ import annotations

import pytest
import torch

from gpu_worker.model.attention import (ROW_CHUNK_ROWS, CpuAttentionPlan, build_attention_metadata, cpu_paged_attention,
                                        plan_cpu_attention, plan_native_attention)
from gpu_worker.model.ops.cpu_native import loaded_kernels
from gpu_worker.sampler import Sampler, SamplingRow, argmax_rows
from gpu_worker.sampling_params import SamplingParams


def test_argmax_rows_matches_torch_on_ties_nan_and_inf():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 49152, generator=g)
    x[1, 17] = x[1, 40000] = 50.0               # a tie: the first index wins
    x[2] = float("-inf")                        # every token masked
    x[3, 9] = float("nan")                      # NaN counts as the largest
    x[4, :100] = 3.0e38                          # many ties at the top
    for t in (x, x.double(), x[:, ::2]):
        assert argmax_rows(t) == t.argmax(dim=-1).tolist()


def test_greedy_and_mixed_rows_sample_the_argmax():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(greedy, 5, [1, 2], [], (0,)) for _ in range(3)]
    assert Sampler().sample(logits.clone(), rows)[0] == logits.argmax(dim=-1).tolist()
    rows[1] = SamplingRow(SamplingParams(temperature=0.8, seed=3), 5, [1, 2], [], (0,))
    ids, _ = Sampler().sample(logits.clone(), rows)   # the sampled row takes the _draw path
    assert [ids[0], ids[2]] == logits[[0, 2]].argmax(dim=-1).tolist()
    assert ids[1] == Sampler().sample(logits[1:2].clone(), rows[1:2])[0][0]   # a function of seed and position


def test_decode_only_plan_attends_like_a_mixed_one():
    if loaded_kernels() is None:
        pytest.skip("no C compiler: the plan is the torch one")
    torch.manual_seed(2)
    heads, kv_heads, d, bs = 9, 3, 64, 16
    k_cache, v_cache = (torch.randn(8, bs, kv_heads, d) for _ in range(2))
    tables, lens = [[3, 1], [5, 0, 7]], [20, 37]
    long = ROW_CHUNK_ROWS + 1   # a prefill chunk too long to go as decode rows follows the decode rows
    q, k, v = torch.randn(2 + long, heads, d), torch.randn(2 + long, kv_heads, d), torch.randn(2 + long, kv_heads, d)
    decode_only = plan_native_attention(build_attention_metadata(tables, lens, [1, 1], bs, torch.device("cpu")))
    assert decode_only.decode_tables is decode_only.meta.block_tables
    out = cpu_paged_attention(q[:2], k[:2], v[:2], k_cache.clone(), v_cache.clone(), decode_only, d ** -0.5)
    mixed = plan_native_attention(build_attention_metadata(tables + [[2, 4]], lens + [long], [1, 1, long], bs,
                                                           torch.device("cpu")))
    assert mixed.meta.num_decodes == 2 and mixed.decode_tables.shape[0] == 2 and mixed.prefill_chunks is not None
    ref = cpu_paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), mixed, d ** -0.5)
    torch.testing.assert_close(out, ref[:2], rtol=0, atol=0)


def test_short_chunks_attend_as_decode_rows_causally():
    """A step of short chunks (speculative verification) is planned as one decode row per
    token: each row attends exactly as a decode row at its own length would (the same bits),
    and as the prefill kernel and the torch path attend the chunk (to float32 rounding)."""
    if loaded_kernels() is None:
        pytest.skip("no C compiler: the plan is the torch one")
    torch.manual_seed(3)
    heads, kv_heads, d, bs = 9, 3, 64, 16
    k_cache, v_cache = (torch.randn(12, bs, kv_heads, d) for _ in range(2))
    tables, lens, q_lens = [[3, 1], [5, 0, 7], [9], [2, 4, 6, 8]], [20, 37, 5, 50], [1, 3, 5, 1]
    n = sum(q_lens)
    q, k, v = torch.randn(n, heads, d), torch.randn(n, kv_heads, d), torch.randn(n, kv_heads, d)
    meta = build_attention_metadata(tables, lens, q_lens, bs, torch.device("cpu"))
    plan = plan_native_attention(meta)
    assert plan.prefill_chunks is None and plan.decode_rows == n
    assert plan.decode_lens.tolist() == [20, 35, 36, 37, 1, 2, 3, 4, 5, 50]
    caches = k_cache.clone(), v_cache.clone()
    out = cpu_paged_attention(q, k, v, *caches, plan, d ** -0.5)
    row = 0
    for table, end, ql in zip(tables, lens, q_lens):   # each row alone, a decode row at its length
        for j in range(ql):
            alone = plan_native_attention(build_attention_metadata([table], [end - ql + 1 + j], [1], bs,
                                                                   torch.device("cpu")))
            o = loaded_kernels().paged_decode(q[row:row + 1], *caches, alone.decode_tables, alone.decode_lens,
                                              d ** -0.5, torch.empty(1, heads, d))
            torch.testing.assert_close(out[row:row + 1], o, rtol=0, atol=0)
            row += 1
    by_chunks = CpuAttentionPlan(meta, torch.tensor(lens[:1], dtype=torch.int64),   # the first row a decode row
                                 torch.tensor([[1, 3, 37], [4, 5, 5], [9, 1, 50]], dtype=torch.int64),
                                 meta.block_tables[:1])
    ref = cpu_paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), by_chunks, d ** -0.5)   # the prefill kernel
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, cpu_paged_attention(q, k, v, k_cache.clone(), v_cache.clone(),
                                                        plan_cpu_attention(meta), d ** -0.5), rtol=1e-5, atol=1e-5)

"""The shortcuts of a small decode step give what the general paths give: NumPy argmax for
greedy rows, and the decode-only attention plan (no prefill rows, tables sliced once)."""
from __future__ import annotations

import pytest
import torch

from gpu_worker.model.attention import build_attention_metadata, cpu_paged_attention, plan_native_attention
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
    q, k, v = torch.randn(4, heads, d), torch.randn(4, kv_heads, d), torch.randn(4, kv_heads, d)
    decode_only = plan_native_attention(build_attention_metadata(tables, lens, [1, 1], bs, torch.device("cpu")))
    assert decode_only.decode_tables is decode_only.meta.block_tables
    out = cpu_paged_attention(q[:2], k[:2], v[:2], k_cache.clone(), v_cache.clone(), decode_only, d ** -0.5)
    mixed = plan_native_attention(build_attention_metadata(tables + [[2]], lens + [2], [1, 1, 2], bs,
                                                           torch.device("cpu")))   # a prefill row follows
    assert mixed.meta.num_decodes == 2 and mixed.decode_tables.shape[0] == 2
    ref = cpu_paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), mixed, d ** -0.5)
    torch.testing.assert_close(out, ref[:2], rtol=0, atol=0)

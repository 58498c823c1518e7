"""The C paged-prefill kernel of kernels/cpu: causal attention of prefill chunks over their
paged context must agree with a float64 reference on every shape it accepts (SIMD and
portable paths, chunks with and without a cached prefix, rows that end mid-tile)."""
import random

import pytest
import torch

from gpu_worker.model.ops.cpu_native import loaded_kernels

kernels = loaded_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C compiler: the torch path is the only one")


def _case(chunks, heads, kv_heads, head_dim, block_size, seed=0):
    """chunks: (rows, context) pairs. Returns q [tokens, heads, d] as a row-strided view,
    the caches, block tables and the [n, 3] chunk table."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-ctx // block_size) for _, ctx in chunks]
    num_blocks = sum(blocks) + 2
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    tables = torch.zeros(len(chunks), max(blocks + [1]) + 1, dtype=torch.int64)
    used = 0
    for i, b in enumerate(blocks):
        tables[i, :b] = torch.tensor(order[used:used + b])
        used += b
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    tokens = sum(rows for rows, _ in chunks) + 3          # rows outside every chunk stay untouched
    wide = torch.randn(tokens, heads + 2, head_dim, generator=gen)
    q = wide[:, 1:heads + 1]                               # strided rows, as a view of the qkv output
    table, first = [], 2
    for rows, ctx in chunks:
        table.append([first, rows, ctx])
        first += rows
    return q, k_cache, v_cache, tables, torch.tensor(table, dtype=torch.int64).reshape(-1, 3)


def _reference(q, k_cache, v_cache, tables, chunks, scale, out):
    group = q.shape[1] // k_cache.shape[2]
    for c, (first, rows, ctx) in enumerate(chunks.tolist()):
        k = k_cache[tables[c]].flatten(0, 1)[:ctx].double()
        v = v_cache[tables[c]].flatten(0, 1)[:ctx].double()
        for i in range(rows):
            pos = ctx - rows + i
            for h in range(q.shape[1]):
                p = torch.softmax(k[:pos + 1, h // group] @ q[first + i, h].double() * scale, dim=0)
                out[first + i, h] = p @ v[:pos + 1, h // group]
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [
    (9, 3, 64, 16),      # SmolLM2
    (8, 8, 32, 32),      # no grouping, a block of two tiles
    (32, 8, 128, 16),    # Llama-3-8B
    (14, 2, 96, 16),     # groups of 7, head_dim 96
    (4, 2, 16, 16),      # the tiny test models' heads
    (6, 2, 24, 16),      # head_dim not served by the SIMD path: portable loops
    (4, 2, 64, 8),       # block smaller than a tile: portable loops
])
@pytest.mark.parametrize("chunks", [
    [(1, 1)],
    [(5, 5), (17, 17)],                   # whole prompts
    [(40, 40), (3, 50), (33, 130), (1, 16)],   # chunks after a cached prefix, one ending at a block edge
])
def test_paged_prefill_matches_causal_attention_over_the_context(heads, kv_heads, head_dim, block_size, chunks):
    q, k_cache, v_cache, tables, table = _case(chunks, heads, kv_heads, head_dim, block_size)
    scale = head_dim ** -0.5
    out = torch.full(q.shape, float("nan"))
    kernels.paged_prefill(q, k_cache, v_cache, tables, table, scale, out)
    want = _reference(q, k_cache, v_cache, tables, table, scale, torch.full(q.shape, float("nan"), dtype=torch.float64))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6, equal_nan=True)


def test_a_long_prompt_spans_many_work_items():
    q, k_cache, v_cache, tables, table = _case([(300, 300), (70, 380)], 9, 3, 64, 16, seed=1)
    out = torch.full(q.shape, float("nan"))
    kernels.paged_prefill(q, k_cache, v_cache, tables, table, 0.125, out)
    want = _reference(q, k_cache, v_cache, tables, table, 0.125, torch.full(q.shape, float("nan"), dtype=torch.float64))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 8, 32), (32, 8, 128)])
def test_keys_past_a_context_and_blocks_past_a_table_are_never_used(heads, kv_heads, head_dim):
    """Chunks whose contexts end inside a 64-key step, at its edge and one past it, rows
    whose own keys end before the step's (beside rows that see more): the K/V slots past
    each context hold NaN, and every block-table entry past a sequence's last block is an
    id far outside the cache, which the kernel must never read."""
    chunks = [(70, 70), (5, 100), (21, 85), (64, 64), (65, 129), (3, 16)]
    q, k_cache, v_cache, tables, table = _case(chunks, heads, kv_heads, head_dim, 16, seed=2)
    bs, clean = 16, tables.clone()      # the reference gathers whole table rows
    for c, (rows, ctx) in enumerate(chunks):
        last, used = tables[c, (ctx - 1) // bs], -(-ctx // bs)
        k_cache[last, ctx % bs or bs:] = float("nan")
        v_cache[last, ctx % bs or bs:] = float("nan")
        tables[c, used:] = 1 << 40
    out = torch.full(q.shape, float("nan"))
    kernels.paged_prefill(q, k_cache, v_cache, tables, table, head_dim ** -0.5, out)
    want = _reference(q, k_cache, v_cache, clean, table, head_dim ** -0.5,
                      torch.full(q.shape, float("nan"), dtype=torch.float64))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6, equal_nan=True)
    assert not out[2:2 + sum(r for r, _ in chunks)].isnan().any()


def test_the_simd_path_serves_the_common_shapes():
    if kernels.simd is None:
        pytest.skip("neither AVX-512 nor AVX2 here: the portable loops serve every shape")
    assert kernels.vectorized(9, 3, 64, 16, "prefill") and kernels.vectorized(32, 8, 128, 16, "prefill")
    assert not kernels.vectorized(6, 2, 24, 16, "prefill") and not kernels.vectorized(4, 2, 64, 8, "prefill")


def test_bad_chunks_raise_before_the_kernel_runs():
    q, k_cache, v_cache, tables, table = _case([(5, 20)], 9, 3, 64, 16)
    out = torch.empty(q.shape)
    for bad in ([[2, 5, 4]],            # fewer context tokens than rows
                [[2, 5, 200]],          # a context past its block table
                [[q.shape[0], 5, 20]]):  # rows past q
        with pytest.raises(ValueError, match="chunks"):
            kernels.paged_prefill(q, k_cache, v_cache, tables, torch.tensor(bad), 0.125, out)
    with pytest.raises(ValueError, match="float32"):
        kernels.paged_prefill(q.double(), k_cache, v_cache, tables, table, 0.125, out)


def test_the_attention_benchmark_compares_the_same_step_both_ways():
    import argparse

    from gpu_worker.bench.cpu_attention import measure

    args = argparse.Namespace(heads=4, kv_heads=2, head_dim=32, layers=2, block_size=16)
    mixed = measure("mixed", [30, 41, 70, 20], [1, 1, 70, 5], args)       # decode rows, a prompt, a chunk
    assert mixed["tokens"] == 77 and mixed["context_tokens"] == 161
    assert mixed["max_abs_diff"] < 1e-5 and mixed["torch_ms"] > 0 and mixed["kernel_ms"] > 0


def test_stale_slots_past_the_context_never_reach_the_output():
    # A freed block keeps whatever its last owner wrote; the slots past this chunk's
    # context must not leak in, even as NaN (0 * NaN would).
    q, k_cache, v_cache, tables, table = _case([(5, 21), (3, 3)], 9, 3, 64, 16)
    for c, (_, _, ctx) in enumerate(table.tolist()):
        last = int(tables[c, (ctx - 1) // 16])
        k_cache[last, ctx % 16 or 16:] = float("nan")
        v_cache[last, ctx % 16 or 16:] = float("nan")
    out = torch.full(q.shape, float("nan"))
    kernels.paged_prefill(q, k_cache, v_cache, tables, table, 0.125, out)
    rows = torch.cat([torch.arange(f, f + r) for f, r, _ in table.tolist()])
    assert torch.isfinite(out[rows]).all()

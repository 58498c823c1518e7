"""The C paged-decode kernel of kernels/cpu: built with the machine's compiler, it must agree
with attention over the gathered context (float64 reference) on every shape it accepts, on
both its SIMD and portable paths, and the engine must give the same greedy tokens with it
and without it."""
import random

import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.model.attention import AttentionMetadata, plan_cpu_attention
from gpu_worker.model.ops.cpu_native import loaded_kernels

kernels = loaded_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C compiler: the torch path is the only one")


def _case(n, heads, kv_heads, head_dim, block_size, lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-length // block_size) for length in lens]
    num_blocks = sum(blocks) + 3
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)    # scattered blocks, as after churn
    tables = torch.zeros(n, max(blocks + [1]) + 2, dtype=torch.int64)   # wider than needed
    used = 0
    for i, b in enumerate(blocks):
        tables[i, :b] = torch.tensor(order[used:used + b], dtype=torch.int64)
        used += b
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    q = torch.randn(n, heads, head_dim, generator=gen)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int64)


def _reference(q, k_cache, v_cache, tables, lens, scale):
    n, heads, head_dim = q.shape
    group = heads // k_cache.shape[2]
    out = torch.zeros(n, heads, head_dim, dtype=torch.float64)
    for i in range(n):
        length = int(lens[i])
        if length == 0:
            continue
        k = k_cache[tables[i]].flatten(0, 1)[:length].double()    # [len, kv_heads, d]
        v = v_cache[tables[i]].flatten(0, 1)[:length].double()
        for h in range(heads):
            p = torch.softmax(k[:, h // group] @ q[i, h].double() * scale, dim=0)
            out[i, h] = p @ v[:, h // group]
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [
    (9, 3, 64, 16),      # SmolLM2
    (8, 8, 64, 16),      # no grouping
    (32, 8, 128, 16),    # Llama-3-8B
    (4, 1, 32, 32),      # a block holds two tiles
    (4, 2, 16, 16),      # the tiny test models' heads
    (6, 2, 24, 16),      # head_dim not a multiple of 16: portable loops
    (4, 2, 64, 8),       # block smaller than a tile: portable loops
    (14, 2, 96, 16),     # head_dim 96, groups of 7
    (16, 1, 64, 16),     # groups of 16: portable loops
])
@pytest.mark.parametrize("lens", [[1], [17, 3], [5, 16, 33, 1, 250, 64, 15, 2, 100]])
def test_paged_decode_matches_attention_over_the_gathered_context(heads, kv_heads, head_dim, block_size, lens):
    q, k_cache, v_cache, tables, seq_lens = _case(len(lens), heads, kv_heads, head_dim, block_size, lens)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, out)
    torch.testing.assert_close(out.double(), _reference(q, k_cache, v_cache, tables, seq_lens, scale),
                               rtol=1e-5, atol=2e-6)


def test_decode_prefetch_settings_change_speed_only():
    """How far ahead decode attention prefetches, and into which cache, leaves every output
    the same bits (the prefetch reads nothing the sums use); the setting reads back."""
    q, k_cache, v_cache, tables, lens = _case(5, 9, 3, 64, 16, [1, 40, 300, 17, 129], seed=4)
    previous = kernels.decode_tuning()
    outs = []
    try:
        for tiles, l2 in ((0, False), (1, False), (2, True), (6, True)):
            assert kernels.decode_tuning(tiles, l2) == {"prefetch_tiles": tiles, "prefetch_l2": l2}
            outs.append(kernels.paged_decode(q, k_cache, v_cache, tables, lens, 0.125, torch.empty_like(q)))
    finally:
        kernels.decode_tuning(**previous)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    with pytest.raises(ValueError, match="0-64"):
        kernels.decode_tuning(prefetch_tiles=65)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_each_sequence_gets_the_bits_it_gets_alone_whatever_the_batch(threads):
    """Many rows go to the threads in contiguous shares, each sequence prefetching the next
    one's first tiles; few go one KV head at a time. Either way a row's output is the bits it
    gets in a batch of its own, empty contexts anywhere in the batch give zeros, and every
    row is written (NaN-filled output)."""
    lens = [0, 40, 300, 17, 0, 129, 1, 64, 16, 33, 250, 5, 0]
    q, k_cache, v_cache, tables, seq_lens = _case(len(lens), 9, 3, 64, 16, lens, seed=6)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        tiles = kernels.decode_tuning()["prefetch_tiles"]
        for ahead in (tiles, 1, 6):   # 6: the prefetch runs past short sequences into later ones
            kernels.decode_tuning(prefetch_tiles=ahead)
            out = kernels.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125, torch.full_like(q, float("nan")))
            for i in range(len(lens)):
                alone = kernels.paged_decode(q[i:i + 1], k_cache, v_cache, tables[i:i + 1], seq_lens[i:i + 1], 0.125,
                                             torch.full_like(q[i:i + 1], float("nan")))
                assert torch.equal(out[i], alone[0]), (ahead, i)
                if lens[i] == 0:
                    assert torch.equal(out[i], torch.zeros_like(out[i]))
    finally:
        kernels.decode_tuning(prefetch_tiles=tiles)
        torch.set_num_threads(previous)


def test_the_simd_path_serves_the_common_shapes():
    if kernels.simd is None:
        pytest.skip("neither AVX-512 nor AVX2 here: the portable loops serve every shape")
    assert kernels.vectorized(9, 3, 64, 16) and kernels.vectorized(32, 8, 128, 32) and kernels.vectorized(4, 1, 32, 16)
    assert kernels.vectorized(14, 2, 96, 16) and kernels.vectorized(8, 8, 64, 16) and kernels.vectorized(4, 2, 16, 16)
    assert not kernels.vectorized(6, 2, 24, 16) and not kernels.vectorized(4, 2, 64, 8)
    assert not kernels.vectorized(16, 1, 64, 16) and not kernels.vectorized(4, 2, 256, 16)


def test_the_build_takes_the_widest_vector_set_this_cpu_has():
    from gpu_worker.model.ops.cpu_linear import cpu_flags

    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    want = ("avx512" if {"avx512f", "avx512bw"} <= flags else "avx2" if {"avx2", "fma"} <= flags else None)
    assert kernels.simd == want


def test_an_empty_context_gives_zeros_and_bad_input_raises():
    q, k_cache, v_cache, tables, lens = _case(2, 4, 2, 64, 16, [0, 5])
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode(q, k_cache, v_cache, tables, lens, 0.125, out)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isfinite(out[1]).all()
    with pytest.raises(ValueError, match="float32"):
        kernels.paged_decode(q.double(), k_cache, v_cache, tables, lens, 0.125, out)
    with pytest.raises(ValueError, match="int64"):
        kernels.paged_decode(q, k_cache, v_cache, tables.int(), lens, 0.125, out)
    with pytest.raises(ValueError, match="matching shapes"):
        kernels.paged_decode(q[:, :3].contiguous(), k_cache, v_cache, tables, lens, 0.125, out)


def test_the_cpu_backend_plans_decode_rows_for_the_kernel_and_the_switch_turns_it_off():
    from gpu_worker.model.ops.backends import select_ops

    meta = AttentionMetadata(torch.tensor([4, 20]), torch.tensor([[0], [1]]), [5, 9], [1, 1], 2, 16)
    assert select_ops("cpu").name == "cpu" and select_ops("cpu", "cpu").name == "cpu"
    assert select_ops("cpu").plan_attention(meta).decode_lens.tolist() == [5, 9]
    assert plan_cpu_attention(meta).decode_lens is None        # the torch backend: gather + SDPA
    assert select_ops("cpu", cpu_kernels=False).name == "torch"
    assert select_ops("cpu", cpu_kernels=False).plan_attention(meta).decode_lens is None
    with pytest.raises(ValueError, match="unknown ops backend"):
        select_ops("cpu", "fast")


@pytest.mark.parametrize("model", ["tiny_llama_dir", "tiny_qwen_dir"])
def test_engine_tokens_are_the_same_with_the_cpu_and_the_torch_backends(model, request):
    model_dir = request.getfixturevalue(model)
    prompts = [[(7 * i + j) % 90 + 3 for j in range(5 + 11 * i)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(model_dir, kv_cache_memory=8 << 20)
    assert llm.engine.model.ops.name == "cpu"
    with_kernels = [o.token_ids for o in llm.generate(prompts, params)]
    llm = LLM(model_dir, kv_cache_memory=8 << 20, ops_backend="torch")
    assert llm.engine.model.ops.name == "torch"
    assert [o.token_ids for o in llm.generate(prompts, params)] == with_kernels


def test_a_failing_compiler_leaves_the_torch_path(tmp_path, monkeypatch):
    from kernels.cpu import load

    monkeypatch.setenv("CC", "false")
    assert load(tmp_path) is None
    assert not list(tmp_path.glob("*.so*"))      # nothing half-written is left behind


def test_the_build_is_cached(tmp_path):
    from kernels.cpu import load

    first = load(tmp_path)
    assert first is not None and first.path.parent == tmp_path
    mtime = first.path.stat().st_mtime_ns
    assert load(tmp_path).path == first.path and first.path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("rows", [1, 7, 8, 300])
def test_glue_ops_match_the_torch_ops(rows):
    from gpu_worker.model.ops import cpu_ops, torch_ops

    gen = torch.Generator().manual_seed(rows)
    heads, kv_heads, d, hidden, inter = 9, 3, 64, 576, 1536
    x, w = torch.randn(rows, hidden, generator=gen), torch.randn(hidden, generator=gen)
    for residual in (None, torch.randn(rows, hidden, generator=gen)):
        got, got_res = cpu_ops.add_rms_norm(x.clone(), None if residual is None else residual.clone(), w, 1e-5)
        want, want_res = torch_ops.add_rms_norm(x.clone(), None if residual is None else residual.clone(), w, 1e-5)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(got_res, want_res, rtol=0, atol=0)

    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen)
    positions = torch.randint(0, 500, (rows,), generator=gen)
    angles = torch.arange(512.0)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rotated(backend):
        buf = qkv.clone()
        q, k, _ = buf.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k = backend.rope(q.view(rows, heads, d), k.view(rows, kv_heads, d), backend.prepare_rope(positions, cos, sin))
        return q, k

    for got, want in zip(rotated(cpu_ops.CPU_OPS), rotated(torch_ops.TORCH_OPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)     # the same roundings

    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    torch.testing.assert_close(cpu_ops.silu_and_mul(gate_up), torch_ops.silu_and_mul(gate_up.clone()),
                               rtol=4e-6, atol=1e-6)


def test_glue_ops_fall_back_to_torch_where_the_kernels_do_not_apply():
    from gpu_worker.model.ops import cpu_ops, torch_ops

    x = torch.randn(4, 32).bfloat16()
    torch.testing.assert_close(cpu_ops.silu_and_mul(x), torch_ops.silu_and_mul(x.clone()))
    normed, _ = cpu_ops.add_rms_norm(x, None, torch.ones(32).bfloat16(), 1e-5)
    torch.testing.assert_close(normed, torch_ops.add_rms_norm(x, None, torch.ones(32).bfloat16(), 1e-5)[0])
    strided = torch.randn(4, 64)[:, ::2]                          # not contiguous: torch path
    torch.testing.assert_close(cpu_ops.silu_and_mul(strided), torch_ops.silu_and_mul(strided))


def test_the_glue_wrappers_refuse_what_they_cannot_take():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError):
        kernels.silu_and_mul(x, torch.empty(4, 15))                      # wrong width
    with pytest.raises(ValueError):
        kernels.add_rms_norm(x.double(), None, torch.ones(32), 1e-5, torch.empty(4, 32))
    with pytest.raises(ValueError):
        kernels.add_rms_norm(x, torch.randn(3, 32), torch.ones(32), 1e-5, torch.empty(4, 32))
    q, k = torch.randn(4, 2, 8), torch.randn(4, 1, 8)
    table = torch.randn(16, 8)
    with pytest.raises(ValueError):
        kernels.rope(q, k, torch.arange(4, dtype=torch.int32), table, table)   # int32 positions
    with pytest.raises(ValueError):
        kernels.rope(q[:, :, ::2], k[:, :, ::2], torch.arange(4), table[:, :4], table[:, :4])

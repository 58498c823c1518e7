"""The model's ``keep`` rows: a pass that wants only the rows that sample runs the last
layer's output projection and MLP for them alone, and gives them the values of the whole
pass, with every row's K/V stored as before."""
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.model.attention import build_attention_metadata
from gpu_worker.model.ops.cpu_native import loaded_kernels

BS = 16


def a_mixed_step(llm):
    """Two decode rows, a 21-token chunk after a cached prefix of 11, and a whole 30-token
    prompt: ids, positions, the plan, and a copy of the KV caches to run on."""
    model, runner = llm.engine.model, llm.engine.runner
    g = torch.Generator().manual_seed(4)
    tables = [[3], [5, 6], [1, 2], [8, 9]]
    seq_lens, query_lens = [9, 20, 32, 30], [1, 1, 21, 30]
    positions = [p for end, n in zip(seq_lens, query_lens) for p in range(end - n, end)]
    ids = torch.randint(3, 40000, (len(positions),), generator=g)
    meta = build_attention_metadata(tables, seq_lens, query_lens, BS, torch.device("cpu"))
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    for k, v in caches:   # the cached contexts the rows attend to
        k.normal_(generator=g), v.normal_(generator=g)
    return model, ids, torch.tensor(positions), model.ops.plan_attention(meta), caches


def test_kept_rows_get_the_whole_pass_values_and_every_row_its_kv(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=16 << 20)
    model, ids, positions, plan, caches = a_mixed_step(llm)
    n = ids.shape[0]
    whole_caches = [(k.clone(), v.clone()) for k, v in caches]
    whole = model(ids, positions, whole_caches, plan)
    assert whole.shape[0] == n == 53
    lib = loaded_kernels()
    one_chain = 2 if lib is not None and lib.simd == "avx512" else 5   # rows from which every C matmul row is one chain
    for keep in ([0, 1, 22, 52], [0, 1, 5, 22, 40, 52], list(range(0, n, 3)), [52], []):
        kept_caches = [(k.clone(), v.clone()) for k, v in caches]
        got = model(ids, positions, kept_caches, plan, keep=torch.tensor(keep, dtype=torch.long))
        assert got.shape == (len(keep), whole.shape[1])
        if lib is not None and len(keep) >= one_chain:   # the same bits
            assert torch.equal(got, whole[keep])
        else:   # the C matmuls sum a lone row (AVX2: blocks of 1-4 rows) in more chains (torch picks its kernels by shape)
            torch.testing.assert_close(got, whole[keep], rtol=1e-5, atol=1e-5)
        for (k, v), (wk, wv) in zip(kept_caches, whole_caches):   # every layer's K/V, every row
            assert torch.equal(k, wk) and torch.equal(v, wv)


def test_generation_is_unchanged_when_prefill_rows_are_dropped(tiny_llama_dir):
    """End to end: chunked prefill (a chunk budget smaller than the prompts) with decode rows
    mixed in, against the same engine passing every row through the last layer."""
    prompts = [[1, 500 + 7 * i, 900 + i, 40 + 3 * i] * (3 + 2 * i) for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=8 + i, ignore_eos=True) for i in range(6)]
    llm = LLM(tiny_llama_dir, kv_cache_memory=16 << 20, max_num_batched_tokens=32)
    model, kept = llm.engine.model, []
    forward = model.forward

    def whole(input_ids, positions, kv_caches, plan, keep=None):
        kept.append(keep is not None)
        out = forward(input_ids, positions, kv_caches, plan)
        return out if keep is None else out.index_select(0, keep)

    got = [o.token_ids for o in llm.generate(prompts, params)]
    model.forward = whole
    assert got == [o.token_ids for o in llm.generate(prompts, params)]
    assert any(kept)   # some steps had rows that do not sample

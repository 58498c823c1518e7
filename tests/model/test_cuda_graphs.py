"""The padded static decode path that CUDA graphs capture, run eagerly under the Triton
interpreter: same hidden states as the normal step, and padding rows write no KV."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.model.cuda_graphs import DecodeGraphs, capture_decode_graphs, default_sizes

pytest.importorskip("triton")


def test_default_sizes():
    assert default_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert default_sizes(256)[-3:] == [64, 128, 256]
    assert default_sizes(1) == [1]


def test_padded_static_decode_equals_eager_step(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=4 << 20, block_size=8, ops_backend="triton")
    eng = llm.engine
    assert capture_decode_graphs(eng.model, eng.runner.kv_caches, max_num_seqs=4, max_model_len=64,
                                 block_size=8) is None   # not on CUDA
    for i, n in enumerate((3, 12, 20)):
        eng.add_request(str(i), list(range(100, 100 + n)), SamplingParams(temperature=0, max_tokens=8))
    eng.step()
    eng.step()   # every request is decoding now
    sched = eng.scheduler.schedule()
    batch = eng.runner.prepare(sched)
    assert batch.meta.num_decodes == 3
    caches = eng.runner.kv_caches
    eager = eng.model(batch.input_ids, batch.positions, caches, eng.model.ops.plan_attention(batch.meta))
    snapshot = [(k.clone(), v.clone()) for k, v in caches]
    graphs = DecodeGraphs(eng.model, caches, max_batch=8, max_blocks_per_seq=8, sizes=[1, 4, 8], capture=False)
    assert graphs.can_run(batch.meta)
    padded = graphs.run(batch.input_ids, batch.positions, batch.meta)   # 3 rows padded to 4
    torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)
    for (k0, v0), (k1, v1) in zip(snapshot, caches):   # same K/V rewritten, padding wrote none
        assert torch.equal(k0, k1) and torch.equal(v0, v1)

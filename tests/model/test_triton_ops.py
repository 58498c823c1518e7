"""The Triton backend (under the interpreter on a CPU) drives the model to the same greedy
tokens as the torch backend and as transformers, on mixed prefill + decode batches."""
import pytest

from gpu_worker import LLM, SamplingParams

pytest.importorskip("triton")

GREEDY = dict(temperature=0, ignore_eos=True)


def _prompts():
    import random

    rng = random.Random(7)
    return [[rng.randrange(100, 48000) for _ in range(n)] for n in (5, 23, 40)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_triton_ops_match_torch_ops_and_transformers(arch, tiny_llama_dir, tiny_qwen_dir, hf_reference):
    model_dir = tiny_llama_dir if arch == "llama" else tiny_qwen_dir
    ps = _prompts()
    params = SamplingParams(max_tokens=5, **GREEDY)
    # A 16-token budget forces chunked prefill (cached prefix) beside running decodes.
    opts = dict(kv_cache_memory=8 << 20, max_num_batched_tokens=16, block_size=8)
    llm = LLM(model_dir, ops_backend="triton", **opts)
    assert llm.engine.model.ops.name == "triton"
    triton_out = [o.token_ids for o in llm.generate(ps, params)]
    torch_out = [o.token_ids for o in LLM(model_dir, ops_backend="torch", **opts).generate(ps, params)]
    assert triton_out == torch_out
    assert triton_out == [hf_reference(model_dir, p, 5) for p in ps]

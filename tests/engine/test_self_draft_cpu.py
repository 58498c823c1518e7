"""A quantized self-drafter on the CPU runs as its target does: its own weights on huge pages
(the head it shares with the target stays where it is), its decode steps through the fused C
layers, its tokens from the target's greedy screen; and it drafts exactly what the per-op
path with the full logits drafts."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams, cpu_tuning
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.spec.model_draft import greedy

PROMPTS = [[5, 17, 300, 41], list(range(100, 160)), [7, 7, 7, 9, 11] * 6]


def _spec_engine(model_dir, **kw):
    return LLM(model_dir, kv_cache_memory=16 << 20, max_num_batched_tokens=64, speculative="self",
               self_draft_quantization="int8", num_speculative_tokens=3, spec_adaptive=False, **kw)


def _run(llm):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    tokens = [o.token_ids for o in llm.generate(PROMPTS, params)]
    stats = llm.engine.stats()
    return tokens, stats["spec_drafted_tokens"], stats["spec_accepted_tokens"]


def _models(llm):
    target, draft = llm.engine.model, llm.engine.speculator.proposer.model
    if target.ops.name != "cpu" or target.fused_decode is None:
        pytest.skip("the packed CPU kernels (and their fused decode layers) do not run here")
    assert draft.fused_decode is not None   # the int8 draft takes the fused layers as its target does
    return target, draft


def _storages(model, fmt):
    return {m.packed.data.untyped_storage().data_ptr() for m in model.modules()
            if isinstance(m, CpuPackedLinear) and m.packed.fmt == fmt}


def test_the_drafter_has_fused_layers_and_its_own_huge_pages(tiny_llama_dir, monkeypatch):
    # int8: the tiny model's int4 groups would span whole rows, which the packed kernels do not serve
    monkeypatch.setattr(cpu_tuning, "_HUGE_PAGE", 4096)   # the tiny model's few MB count as large
    llm = _spec_engine(tiny_llama_dir)
    target, draft = _models(llm)
    head = target.packed_head.packed
    assert draft.packed_head.packed is head and draft.greedy_head is target.greedy_head   # shared, not copied
    mine, theirs = _storages(draft, "int8"), _storages(target, "f32")
    assert len(mine) == 1 and len(theirs) == 1 and not mine & theirs   # one mapping each, apart
    assert head.data.untyped_storage().data_ptr() in theirs           # the head stayed in the target's


def test_without_huge_pages_the_drafter_stays_where_it_was_packed(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(cpu_tuning, "_HUGE_PAGE", 4096)
    llm = _spec_engine(tiny_llama_dir, huge_pages=False)
    _, draft = _models(llm)
    assert len(_storages(draft, "int8")) > 1


def test_fused_drafts_are_the_per_op_drafts(tiny_llama_dir):
    fused = _spec_engine(tiny_llama_dir)
    _models(fused)
    per_op = _spec_engine(tiny_llama_dir)
    draft = per_op.engine.speculator.proposer.model
    draft.fused_decode, draft.greedy_head = None, None   # op by op, argmax of the whole head's logits
    got, want = _run(fused), _run(per_op)
    assert got == want      # the same tokens, and the same drafts: as many drafted and accepted
    assert sum(got[1].values()) > 0 and sum(got[2].values()) > 0


def test_greedy_is_the_argmax_of_the_logits(tiny_llama_dir):
    model = LLM(tiny_llama_dir, kv_cache_memory=16 << 20).engine.model
    hidden = torch.randn(5, model.cfg.hidden_size) * 3
    assert greedy(model, hidden) == model.compute_logits(hidden).argmax(dim=-1).tolist()

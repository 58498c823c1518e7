"""The engine on tiny random-weight Llama and Qwen2 models, against transformers."""
import time
import types

import pytest

from gpu_worker import LLM, SamplingParams
from gpu_worker import scheduler as scheduler_module
from gpu_worker.errors import InvalidRequestError

GREEDY = dict(temperature=0, ignore_eos=True)


def prompts(n, seed=0):
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 48000) for _ in range(rng.randrange(3, 90))] for _ in range(n)]


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return LLM(tiny_llama_dir, kv_cache_memory=64 << 20, max_num_batched_tokens=64, block_size=16)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_continuous_batch_matches_transformers(arch, tiny_llama_dir, tiny_qwen_dir, hf_reference):
    model_dir = tiny_llama_dir if arch == "llama" else tiny_qwen_dir
    llm = LLM(model_dir, kv_cache_memory=64 << 20, max_num_batched_tokens=48)   # forces chunked prefill
    ps = prompts(10, seed=1)
    ps += [ps[0] + [5, 6, 7], ps[0][:40]]                                        # shared prefixes
    outs = llm.generate(ps, [SamplingParams(max_tokens=6 + i, **GREEDY) for i in range(len(ps))])
    for i, (p, o) in enumerate(zip(ps, outs)):
        assert o.token_ids == hf_reference(model_dir, p, 6 + i), f"prompt {i}"
        assert o.finish_reason == "length"


def test_preemption_under_a_small_kv_budget_keeps_outputs(tiny_llama_dir, hf_reference):
    # 12 blocks of 16 tokens: far less than the batch wants, so requests are preempted.
    llm = LLM(tiny_llama_dir, kv_cache_memory=12 * 16 * 2 * 2 * 2 * 16 * 4, max_num_batched_tokens=64)
    ps = prompts(6, seed=2)
    outs = llm.generate(ps, SamplingParams(max_tokens=40, **GREEDY))
    assert llm.engine.scheduler.num_preemptions > 0
    for p, o in zip(ps, outs):
        assert o.token_ids == hf_reference(tiny_llama_dir, p, 40)
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks


def test_prefix_cache_hits_on_shared_prefix(llama):
    base = prompts(1, seed=3)[0] * 2
    llama.generate([base + [11]], SamplingParams(max_tokens=2, **GREEDY))
    out = llama.generate([base + [12]], SamplingParams(max_tokens=2, **GREEDY))[0]
    assert out.num_cached_tokens == (len(base) // 16) * 16 > 0


@pytest.mark.parametrize("bad, code", [
    ([], "empty_prompt"),
    ([1] * 5000, "prompt_too_long"),
    ([10**9], "invalid_token_id"),
])
def test_bad_prompt_raises_typed_error_and_others_finish(llama, bad, code):
    eng = llama.engine
    eng.add_request("good", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    with pytest.raises(InvalidRequestError) as err:
        eng.add_request("bad", bad, SamplingParams(max_tokens=4))
    assert err.value.code == code
    done = _drain(eng)
    assert done["good"].finish_reason == "length" and "bad" not in done


@pytest.mark.parametrize("params, code", [
    (dict(max_tokens=0), "invalid_max_tokens"),
    (dict(top_p=0.0), "invalid_top_p"),
    (dict(top_p=1.5), "invalid_top_p"),
    (dict(temperature=-1), "invalid_temperature"),
    (dict(stop=["x"] * 17), "too_many_stop_strings"),
    (dict(stop_token_ids=[10**9]), "invalid_stop_token_id"),
    (dict(logprobs=99), "invalid_logprobs"),
])
def test_bad_params_raise_typed_error(llama, params, code):
    with pytest.raises(InvalidRequestError) as err:
        llama.engine.add_request("bad", [5, 6], SamplingParams(**params))
    assert err.value.code == code
    assert not llama.engine.has_unfinished_requests()


def test_abort_frees_blocks_and_reports_cancelled(llama):
    eng = llama.engine
    eng.add_request("x", prompts(1, 4)[0], SamplingParams(max_tokens=100, **GREEDY))
    eng.step()
    assert eng.num_free_blocks < eng.num_total_blocks
    eng.abort_request("x")
    assert eng.num_free_blocks == eng.num_total_blocks
    (delta,) = eng.step()
    assert delta.finished and delta.finish_reason == "cancelled"


def test_deadline_stops_a_running_request(llama, monkeypatch):
    eng = llama.engine
    eng.add_request("late", [5, 6, 7], SamplingParams(max_tokens=500, **GREEDY), deadline=time.time() + 1000)
    produced = 0
    while produced < 3:                            # running, tokens out
        produced += sum(len(d.new_token_ids) for d in eng.step())
    # The deadline passes while it runs, however fast the steps are (the scheduler's clock jumps).
    monkeypatch.setattr(scheduler_module, "time", types.SimpleNamespace(time=lambda: time.time() + 2000))
    done = _drain(eng)
    assert done["late"].finish_reason == "timeout"
    monkeypatch.undo()
    eng.add_request("past", [5, 6, 7], SamplingParams(max_tokens=5), deadline=time.time() - 1)
    done = _drain(eng)
    assert done["past"].finish_reason == "timeout" and done["past"].num_output_tokens == 0


def test_stop_string_ends_and_is_not_returned(llama):
    p = prompts(1, 5)[0]
    full = llama.generate([p], SamplingParams(max_tokens=30, **GREEDY))[0]
    stop = full.text[8:12]
    cut = llama.generate([p], SamplingParams(max_tokens=30, stop=[stop], **GREEDY))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]


def test_stop_token_id_and_eos(llama):
    p = prompts(1, 6)[0]
    full = llama.generate([p], SamplingParams(max_tokens=12, **GREEDY))[0]
    target = full.token_ids[5]
    out = llama.generate([p], SamplingParams(max_tokens=12, stop_token_ids=[target], **GREEDY))[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:full.token_ids.index(target) + 1]


def test_resume_continues_exactly(llama):
    p = prompts(1, 7)[0]
    for params in (SamplingParams(max_tokens=20, **GREEDY),
                   SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)):
        full = llama.generate([p], params)[0]
        eng = llama.engine
        eng.add_request("r", p, params, resume_token_ids=full.token_ids[:8])
        done = _drain(eng, collect=True)
        assert done["r"] == full.token_ids[8:]


def test_seeded_sampling_is_batch_independent(llama):
    ps = prompts(4, 8)
    sp = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    alone = llama.generate([ps[0]], sp)[0].token_ids
    crowd = llama.generate(ps, [sp] + [SamplingParams(max_tokens=30, temperature=1.0)] * 3)[0].token_ids
    assert alone == crowd


def test_streaming_yields_tokens_as_they_come(llama):
    seen = {}
    for i, delta in llama.stream([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=5, **GREEDY)):
        seen.setdefault(i, []).extend(delta.new_token_ids)
    assert {len(v) for v in seen.values()} == {5}


def test_chat_and_text_prompts(llama):
    outs = llama.generate(["hello", [{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=3, **GREEDY))
    assert all(len(o.token_ids) == 3 for o in outs)


def _drain(eng, collect=False):
    done, tokens = {}, {}
    while eng.has_unfinished_requests():
        for d in eng.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finished:
                done[d.request_id] = d
    return tokens if collect else done

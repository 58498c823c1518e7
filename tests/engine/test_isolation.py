"""One request's values or failure never takes down a step: it fails alone, typed, and its
batch neighbours produce exactly what they produce in a clean run."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.errors import EngineBrokenError, InvalidRequestError
from gpu_worker.sampler import Sampler, SamplingRow
from tests.engine.faults import poison_forward

GREEDY = dict(temperature=0, ignore_eos=True)
PROMPTS = {"a": [5, 6, 7, 8], "b": [900, 901, 902], "bad": [40, 41, 42, 43, 44], "c": [7000] * 20}


@pytest.fixture
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, kv_cache_memory=64 << 20, max_num_batched_tokens=64, block_size=16)


def run(eng, params=None, prompts=PROMPTS, patch=None):
    """Add every prompt (then ``patch(eng)``), step until done: {id: (tokens, final delta)}."""
    for rid, ids in prompts.items():
        eng.add_request(rid, ids, (params or {}).get(rid, SamplingParams(max_tokens=12, **GREEDY)))
    if patch is not None:
        patch(eng)
    tokens, final = {rid: [] for rid in prompts}, {}
    while eng.has_unfinished_requests():
        for d in eng.step():
            tokens[d.request_id].extend(d.new_token_ids)
            if d.finished:
                assert d.request_id not in final, "two final deltas"
                final[d.request_id] = d
    assert eng.num_free_blocks == eng.num_total_blocks   # a failed request's blocks came back
    return {rid: (tokens[rid], final[rid]) for rid in prompts}


def assert_only_bad_failed(clean, got):
    for rid, (tokens, final) in got.items():
        if rid == "bad":
            assert final.finish_reason == "error" and final.error_code == "internal", final
            assert final.error_message
        else:
            assert final.finish_reason == "length" and tokens == clean[rid][0], rid


@pytest.mark.parametrize("top_k", [2**63, 2**64, 10**6])
def test_top_k_beyond_the_vocab_is_no_top_k(llm, top_k):
    # Before: torch.tensor overflowed in the sampler, failing every step of the engine.
    sampled = dict(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    ref = run(llm.engine, {"bad": SamplingParams(top_k=0, **sampled)})
    got = run(llm.engine, {"bad": SamplingParams(top_k=top_k, **sampled)})
    assert {k: t for k, (t, _) in got.items()} == {k: t for k, (t, _) in ref.items()}
    assert {d.finish_reason for _, d in got.values()} == {"length"}


@pytest.mark.parametrize("params, code", [
    (dict(top_k=-1), "invalid_top_k"),
    (dict(top_k=True), "invalid_top_k"),
    (dict(seed=2**63), "invalid_seed"),
    (dict(seed=2**64), "invalid_seed"),
    (dict(seed=-1), "invalid_seed"),
    (dict(logprobs=True), "invalid_logprobs"),
    (dict(logprobs=2**63), "invalid_logprobs"),
    (dict(max_tokens=True), "invalid_max_tokens"),
    (dict(min_tokens=2**63), "invalid_min_tokens"),
    (dict(temperature=1e300), "invalid_temperature"),
    (dict(repetition_penalty=1e-308), "invalid_repetition_penalty"),
    (dict(repetition_penalty=1e308), "invalid_repetition_penalty"),
    (dict(stop_token_ids=[True]), "invalid_stop_token_id"),
])
def test_values_the_sampler_cannot_take_are_refused(params, code):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**params).validate(vocab_size=1000)
    assert err.value.code == code


def test_largest_seed_and_tiny_temperature_sample():
    logits = 3 * torch.randn(2, 50)
    rows = [SamplingRow(SamplingParams(temperature=1e-300), 0, [], [], ()),
            SamplingRow(SamplingParams(temperature=1.0, seed=2**63 - 1), 2**40, [], [], ())]
    for r in rows:
        r.params.validate(50)
    tokens, _ = Sampler().sample(logits.clone(), rows)
    assert tokens[0] == int(logits[0].argmax())   # a temperature near 0 is greedy, not NaN
    assert 0 <= tokens[1] < 50


def test_postprocess_error_fails_that_request_alone(llm):
    clean = run(llm.engine)

    def break_detokenizer(eng):
        detok = eng.scheduler.requests["bad"].detokenizer
        push = detok.push

        def push_then_explode(token_ids, check_stop=True):
            if len(detok.text) > 0:
                raise RuntimeError("detokenizer exploded")
            return push(token_ids, check_stop)

        detok.push = push_then_explode

    assert_only_bad_failed(clean, run(llm.engine, patch=break_detokenizer))


def test_forward_failing_with_one_request_fails_it_alone(llm):
    clean = run(llm.engine)
    start = llm.engine.num_steps
    got = run(llm.engine, patch=lambda eng: poison_forward(
        eng, lambda ids: "bad" in ids and eng.num_steps >= start + 3))
    assert_only_bad_failed(clean, got)
    assert len(got["bad"][0]) > 0               # it failed mid-generation, after some tokens


def test_forward_failing_once_fails_nobody(llm):
    clean = run(llm.engine)
    failed = []

    def first_full_batch(ids):      # a transient failure: the smaller retries all run
        if len(ids) == len(PROMPTS) and not failed:
            failed.append(ids)
            return True
        return False

    got = run(llm.engine, patch=lambda eng: poison_forward(eng, first_full_batch))
    assert failed and got.keys() == clean.keys()
    assert all(tokens == clean[rid][0] and d.finish_reason == "length" for rid, (tokens, d) in got.items())


def test_forward_always_failing_is_engine_broken(llm):
    eng = llm.engine
    for rid, ids in PROMPTS.items():
        eng.add_request(rid, ids, SamplingParams(max_tokens=12, **GREEDY))
    poison_forward(eng, lambda ids: True)
    with pytest.raises(EngineBrokenError):
        eng.step()
    assert sorted(eng.unfinished_request_ids()) == sorted(PROMPTS)   # all held, none failed


def test_a_lone_request_that_breaks_the_model_fails_alone(llm):
    eng = llm.engine
    poison_forward(eng, lambda ids: "bad" in ids)
    eng.add_request("bad", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    (delta,) = eng.step()                      # the probe runs: it is the request's fault
    assert delta.finish_reason == "error" and not eng.has_unfinished_requests()


def test_a_lone_request_on_a_broken_model_is_held_not_failed(llm):
    eng = llm.engine
    poison_forward(eng, lambda ids: True)      # the probe fails too: the engine is broken
    eng.add_request("first", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    with pytest.raises(EngineBrokenError, match="probe"):
        eng.step()
    assert eng.unfinished_request_ids() == ["first"]


def test_different_requests_failing_alone_in_a_row_mean_broken(llm):
    eng = llm.engine
    poison_forward(eng, lambda ids: "\x00probe" not in ids)   # only the probe still runs
    eng.add_request("first", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    (delta,) = eng.step()
    assert delta.finish_reason == "error"
    eng.add_request("second", [8, 9], SamplingParams(max_tokens=4, **GREEDY))
    with pytest.raises(EngineBrokenError, match="in a row"):
        eng.step()
    assert eng.unfinished_request_ids() == ["second"]


def test_a_failing_draft_fails_that_request_alone(tiny_llama_dir):
    # a fixed depth: the adaptive one reads step times, and on a loaded machine it may give
    # "bad" no draft at all (nothing to fail)
    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20, speculative="ngram", spec_adaptive=False)
    clean = run(llm.engine)
    proposer = llm.engine.speculator.proposer
    propose = proposer.propose

    def explode_for_bad(items):     # a batch with "bad" in it raises, as "bad" alone does
        if any(it.request.prompt_token_ids == PROMPTS["bad"] for it in items):
            raise RuntimeError("drafter exploded")
        return propose(items)

    proposer.propose = explode_for_bad
    assert_only_bad_failed(clean, run(llm.engine))


def test_the_offline_api_says_why_a_request_failed(llm):
    poison_forward(llm.engine, lambda ids: "\x00probe" not in ids)  # the probe still runs
    (out,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **GREEDY))
    assert out.finish_reason == "error" and out.error_code == "internal"
    assert "forward exploded" in out.error_message

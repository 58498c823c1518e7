"""Parallel sampling (n > 1): samples share the prompt's KV blocks, have their own seeds,
and survive preemption of one of them."""
import pytest

from gpu_worker import LLM, SamplingParams
from gpu_worker.fork import sample_seed

SAMPLED = dict(temperature=1.0, ignore_eos=True)
PROMPT = list(range(300, 340))  # 40 tokens: 2 full blocks of 16 and a partial one


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, kv_cache_memory=64 << 20, max_num_batched_tokens=64, block_size=16)


def _choices(out):
    return [c.token_ids for c in out.choices]


def test_n_samples_differ_repeat_with_a_seed_and_sample_0_is_the_n1_output(llm):
    params = SamplingParams(max_tokens=12, seed=7, **SAMPLED)
    out = llm.generate([PROMPT], params, n=3)[0]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({tuple(t) for t in _choices(out)}) == 3        # differ under sampling
    assert all(len(t) == 12 and c.finish_reason == "length" for t, c in zip(_choices(out), out.choices))
    assert _choices(llm.generate([PROMPT], params, n=3)[0]) == _choices(out)   # repeat under a seed
    assert out.token_ids == llm.generate([PROMPT], params)[0].token_ids        # n=1 unchanged
    unseeded = llm.generate([PROMPT], SamplingParams(max_tokens=12, **SAMPLED), n=3)[0]
    assert len({tuple(t) for t in _choices(unseeded)}) == 3
    assert sample_seed(7, 0) == 7 and sample_seed(None, 2) is None and sample_seed(7, 1) != 7


def test_samples_share_the_prompts_full_blocks(llm):
    kv = llm.engine.kv
    free_before = kv.num_free_blocks
    peak = 0
    for _ in llm.stream([PROMPT], SamplingParams(max_tokens=8, seed=1, **SAMPLED), n=3):
        peak = max(peak, free_before - kv.num_free_blocks)
    # Shared: 2 full prompt blocks once + one block each for the partial block and outputs
    # (40 + 8 tokens fit 3 blocks per sample) -> 2 + 3 = 5; copied it would be 9.
    assert peak == 5, peak
    assert llm.engine.kv.prefix_hits >= 2 * 2 * 16


def test_preempting_one_sample_keeps_every_sample_exact(tiny_llama_dir):
    params = SamplingParams(max_tokens=60, seed=3, **SAMPLED)
    roomy = LLM(tiny_llama_dir, kv_cache_memory=64 << 20, max_num_batched_tokens=64, block_size=16)
    want = _choices(roomy.generate([PROMPT], params, n=3)[0])
    # 12 blocks of 16: three samples of 100 tokens need 2 + 3 * 5 = 17, so some are preempted.
    small = LLM(tiny_llama_dir, kv_cache_memory=12 * 16 * 2 * 2 * 2 * 16 * 4, max_num_batched_tokens=64,
                block_size=16)
    got = small.generate([PROMPT], params, n=3)[0]
    assert small.engine.scheduler.num_preemptions > 0
    assert _choices(got) == want


def test_abort_ends_every_sample_and_frees_all_blocks(llm):
    free = llm.engine.kv.num_free_blocks
    llm.sampling.add_request("r", PROMPT, SamplingParams(max_tokens=20, **SAMPLED), n=4)
    llm.sampling.step()   # the leader prefills; the other samples are queued now
    assert llm.sampling.abort_request("r")
    ends = []
    while llm.sampling.has_unfinished_requests():
        ends += [d for d in llm.sampling.step() if d.finished]
    assert sorted(d.index for d in ends) == [0, 1, 2, 3]
    assert {d.finish_reason for d in ends} == {"cancelled"} and {d.request_id for d in ends} == {"r"}
    assert llm.engine.kv.num_free_blocks == free


def test_abort_before_the_fork_ends_the_waiting_samples_too(llm):
    llm.sampling.add_request("early", PROMPT, SamplingParams(max_tokens=20, **SAMPLED), n=3)
    llm.sampling.abort_request("early")
    ends = []
    while llm.sampling.has_unfinished_requests():
        ends += [d for d in llm.sampling.step() if d.finished]
    assert sorted(d.index for d in ends) == [0, 1, 2]
    assert not llm.sampling.unfinished_request_ids()


def test_resume_runs_only_unfinished_samples_from_their_tokens(llm):
    params = SamplingParams(max_tokens=10, seed=5, **SAMPLED)
    want = _choices(llm.generate([PROMPT], params, n=3)[0])
    llm.sampling.add_request("res", PROMPT, params, n=3, resume=[want[0][:4], want[1], want[2][:7]], skip=[1])
    got = {0: list(want[0][:4]), 2: list(want[2][:7])}
    while llm.sampling.has_unfinished_requests():
        for d in llm.sampling.step():
            got[d.index] += d.new_token_ids
    assert got == {0: want[0], 2: want[2]}

"""Scheduler behaviour in ids and counts, without torch or a model."""
from types import SimpleNamespace

import pytest

from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.errors import InvalidRequestError
from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.request import Request, Status
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import Scheduler


class CharTokenizer:
    all_special_ids: set = set()

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def make_req(rid, n_prompt, max_tokens=8, priority=0, arrival=0.0, **params):
    return Request(request_id=rid, prompt_token_ids=list(range(100 * len(rid), 100 * len(rid) + n_prompt)),
                   params=SamplingParams(max_tokens=max_tokens, **params),
                   detokenizer=IncrementalDetokenizer(CharTokenizer()), eos_token_ids=(), max_total_tokens=4096,
                   priority=priority, arrival_time=arrival)


def run_step(s: Scheduler, out, sampled=None):
    """Pretend the model ran: ``sampled`` tokens, or token 1 for every chunk reaching its end."""
    if sampled is None:
        sampled = {x.request.request_id: [1] for x in out.scheduled
                   if x.request.num_computed_tokens + x.num_new_tokens >= x.request.num_tokens}
    return s.update_from_output(out, SimpleNamespace(sampled=sampled, logprobs={}))


def test_one_token_budget_chunks_long_prompts_beside_decodes():
    s = Scheduler(KVCacheManager(100, 4), max_num_batched_tokens=10, max_num_seqs=8)
    s.add_request(make_req("a", 3, arrival=0))
    run_step(s, s.schedule())                   # a: prefill 3 tokens, samples
    s.add_request(make_req("bb", 25, arrival=1))
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("bb", 9)]
    assert out.num_batched_tokens == 10
    run_step(s, out)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("bb", 9)]
    run_step(s, out)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("bb", 7)]


def test_max_num_seqs_caps_running():
    s = Scheduler(KVCacheManager(100, 4), max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(3):
        s.add_request(make_req("r" * (i + 1), 4, arrival=i))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 1


def test_priority_then_arrival_order_for_admission():
    s = Scheduler(KVCacheManager(100, 4), max_num_batched_tokens=4, max_num_seqs=8)
    s.add_request(make_req("low", 4, priority=5, arrival=0))
    s.add_request(make_req("hi2", 4, priority=0, arrival=2))
    s.add_request(make_req("hi1", 4, priority=0, arrival=1))
    assert [r.request_id for r in s.waiting] == ["hi1", "hi2", "low"]
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["hi1"]


def test_preempts_lowest_priority_newest_and_recomputes_later():
    kv = KVCacheManager(6, 4, enable_prefix_caching=False)   # 24 token slots; no prefix hit on return
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add_request(make_req("a", 8, max_tokens=20, priority=0, arrival=0))
    s.add_request(make_req("bb", 8, max_tokens=20, priority=1, arrival=1))
    s.add_request(make_req("ccc", 4, max_tokens=20, priority=0, arrival=2))
    run_step(s, s.schedule())          # all admitted: 2 + 2 + 1 blocks (one free)
    assert kv.num_free_blocks == 1
    for _ in range(4):                 # grow until someone must yield
        run_step(s, s.schedule())
    victim = s.requests["bb"]          # lowest priority (1) goes first
    assert victim.status is Status.PREEMPTED and victim.num_computed_tokens == 0
    assert victim.num_preemptions == 1 and victim in s.waiting
    assert {r.request_id for r in s.running} == {"a", "ccc"}
    # When the others finish, the preempted request is recomputed from scratch.
    for rid in ("a", "ccc"):
        s.abort(rid, "cancelled")
    out = s.schedule()
    assert out.scheduled[0].request is victim and out.scheduled[0].num_new_tokens == victim.num_tokens


def test_abort_frees_blocks_at_once():
    kv = KVCacheManager(10, 4)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add_request(make_req("a", 10))
    run_step(s, s.schedule())
    assert kv.num_free_blocks < 10
    assert s.abort("a", "cancelled")
    assert kv.num_free_blocks == 10 and s.finished[0].finish_reason == "cancelled"
    assert not s.abort("missing", "cancelled")


def test_admission_counts_reservations():
    kv = KVCacheManager(10, 4)        # 40 tokens
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    assert s.can_admit(40) and not s.can_admit(41)
    s.add_request(make_req("a", 4, max_tokens=20))   # reserves 6 blocks though it holds none yet
    assert s.can_admit(16) and not s.can_admit(17)


def test_deadline_passed_before_prefill_times_out():
    s = Scheduler(KVCacheManager(10, 4), max_num_batched_tokens=64, max_num_seqs=8)
    r = make_req("a", 4)
    r.deadline = 1.0                   # long past
    s.add_request(r)
    out = s.schedule()
    assert not out.scheduled and r.finish_reason == "timeout" and s.finished == [r]


def test_rejected_drafts_roll_back_and_accepted_ones_become_outputs():
    kv = KVCacheManager(100, 4)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    r = make_req("a", 3, max_tokens=7)
    s.add_request(r)
    run_step(s, s.schedule())                      # prefill; output [1]
    s.set_drafts({"a": [7, 8, 9, 10, 11, 12]})
    assert r.spec_token_ids == [7, 8, 9, 10, 11]   # 7 - 1 outputs, one left for the bonus token
    out = s.schedule()
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_spec_tokens) == (6, 5)
    assert kv.num_blocks_of("a") == 3              # 9 tokens, drafts included
    (delta,) = run_step(s, out, {"a": [7, 42]})    # draft 7 accepted, 8 rejected, 42 the bonus
    assert delta.new_token_ids == [7, 42] and r.output_token_ids == [1, 7, 42]
    assert r.num_computed_tokens == r.num_tokens - 1 and r.spec_token_ids == []
    assert kv.num_blocks_of("a") == 2              # the rejected drafts' block is back


def test_model_drafter_lookahead_slots_come_with_the_step_that_starts_decoding():
    kv = KVCacheManager(100, 4)
    s = Scheduler(kv, max_num_batched_tokens=6, max_num_seqs=8, num_lookahead_tokens=4)
    s.add_request(make_req("a", 10, max_tokens=20))
    s.add_request(make_req("bb", 2, max_tokens=20, speculative=False))
    run_step(s, s.schedule())                      # a: 6 of 10 prompt tokens, no lookahead yet
    assert kv.num_blocks_of("a") == 2
    run_step(s, s.schedule())                      # a: the last 4 and room for 4 drafts; bb: 2
    assert kv.num_blocks_of("a") == kv.blocks_for(10 + 4) and kv.num_blocks_of("bb") == 1
    assert [r.request_id for r, _ in s.decoding()] == ["a", "bb"]


def test_drafts_of_requests_not_decoding_are_dropped():
    s = Scheduler(KVCacheManager(100, 4), max_num_batched_tokens=4, max_num_seqs=8)
    s.add_request(make_req("a", 10))
    s.schedule()                                   # still prefilling
    s.set_drafts({"a": [1, 2], "missing": [3]})
    assert s.requests["a"].spec_token_ids == []


def test_stop_token_ends_the_request_in_the_update_and_frees_its_blocks():
    kv = KVCacheManager(10, 4)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add_request(make_req("a", 3, stop_token_ids=[5]))
    (delta,) = run_step(s, s.schedule(), {"a": [5]})
    assert delta.finished and (delta.finish_reason, delta.stop_reason) == ("stop", 5)
    assert kv.num_free_blocks == 10 and not s.has_unfinished()


def test_duplicate_request_id_is_refused():
    s = Scheduler(KVCacheManager(10, 4), max_num_batched_tokens=64, max_num_seqs=8)
    s.add_request(make_req("a", 3))
    with pytest.raises(InvalidRequestError) as err:
        s.add_request(make_req("a", 3))
    assert err.value.code == "duplicate_request_id"

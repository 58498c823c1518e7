"""Scheduler behaviour in ids and counts, without torch or a model."""
from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.request import Request, Status
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import Scheduler


class CharTokenizer:
    all_special_ids: set = set()

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def make_req(rid, n_prompt, max_tokens=8, priority=0, arrival=0.0):
    return Request(request_id=rid, prompt_token_ids=list(range(100 * len(rid), 100 * len(rid) + n_prompt)),
                   params=SamplingParams(max_tokens=max_tokens), detokenizer=IncrementalDetokenizer(CharTokenizer()),
                   eos_token_ids=(), max_total_tokens=4096, priority=priority, arrival_time=arrival)


def run_step(s: Scheduler, out):
    """Pretend the model ran: advance computed counts and append one token when due."""
    for sr in out.scheduled:
        r = sr.request
        r.num_computed_tokens += sr.num_new_tokens
        if r.num_computed_tokens >= r.num_tokens:
            r.append_output(1)


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
    kv = KVCacheManager(6, 4)          # 24 token slots
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

"""WorkerMetrics and Health without processes: the rules a dashboard reader relies on."""
from __future__ import annotations

from types import SimpleNamespace

from redis.exceptions import OutOfMemoryError

from gpu_worker.edge.redis_health import RedisHealth
from gpu_worker.health import Health
from gpu_worker.metrics import WorkerMetrics, enqueue_time
from gpu_worker.outputs import RequestDelta
from ops_harness import parse_metrics, value
from prometheus_client import generate_latest


def _samples(m: WorkerMetrics) -> dict:
    return parse_metrics(generate_latest(m.registry).decode())


def _held(entry_id: str, prior: list[int] | None = None):
    return SimpleNamespace(entry=SimpleNamespace(entry_id=entry_id), prior_token_ids=prior or [])


def _report(**fields):
    base = dict(deltas=[], failures=[], admitted=[], released=[], stats={}, num_queued=0,
                step_time=0.0)
    return SimpleNamespace(**{**base, **fields})


def test_enqueue_time_is_the_redis_entry_id():
    assert enqueue_time("1700000000123-7") == 1700000000.123


def test_engine_totals_become_counters_including_speculative_proposers():
    m = WorkerMetrics("m")
    m.on_step(0.01, {"prefix_cache_queries": 10, "prefix_cache_hits": 4, "num_preemptions": 1,
                     "spec_drafted_tokens": {"ngram": 8}, "spec_accepted_tokens": {"ngram": 5}})
    m.on_step(0.02, {"prefix_cache_queries": 15, "prefix_cache_hits": 4, "num_preemptions": 1,
                     "spec_drafted_tokens": {"ngram": 12, "draft": 3},
                     "spec_accepted_tokens": {"ngram": 9, "draft": 1}})
    s = _samples(m)
    assert value(s, "fleet:prefix_cache_queries_total") == 15
    assert value(s, "fleet:prefix_cache_hits_total") == 4
    assert value(s, "fleet:num_preemptions_total") == 1
    assert value(s, "fleet:spec_decode_num_draft_tokens_total", proposer="ngram") == 12
    assert value(s, "fleet:spec_decode_num_accepted_tokens_total", proposer="draft") == 1
    assert value(s, "fleet:engine_step_seconds_count") == 2


def test_per_request_latencies_resume_and_handoff():
    m = WorkerMetrics("m")
    held = {"a": _held("1000000-0"), "b": _held("1000000-1", prior=[5, 6])}
    m.on_report(_report(admitted=["a", "b"], step_time=0.5), held, now=1003.0)
    first = [RequestDelta(request_id="a", new_token_ids=[1], new_text="x", num_prompt_tokens=4,
                          num_output_tokens=1),
             RequestDelta(request_id="b", new_token_ids=[7], new_text="y", num_prompt_tokens=2,
                          num_output_tokens=3)]
    m.on_report(_report(deltas=first), held, now=1004.0)
    last = [RequestDelta(request_id="a", new_token_ids=[2, 3], new_text="z", finished=True,
                         finish_reason="stop", num_output_tokens=3),
            RequestDelta(request_id="b", new_token_ids=[], new_text="", finished=True,
                         finish_reason="handoff", num_output_tokens=3)]
    m.on_report(_report(deltas=last), held, now=1004.5)
    s = _samples(m)
    assert value(s, "fleet:request_queue_time_seconds_count") == 1  # b was resumed
    assert value(s, "fleet:request_queue_time_seconds_sum") == 2.5  # admitted before the step
    assert value(s, "fleet:time_to_first_token_seconds_count") == 1
    assert value(s, "fleet:time_to_first_token_seconds_sum") == 4.0
    assert value(s, "fleet:inter_token_latency_seconds_count") == 1
    assert value(s, "fleet:generation_tokens_total") == 4
    assert value(s, "fleet:prompt_tokens_total") == 6
    assert value(s, "fleet:request_success_total") == 1  # the handoff finishes elsewhere
    assert value(s, "fleet:e2e_request_latency_seconds_sum") == 4.5


def test_n_samples_are_one_request_with_per_sample_latencies():
    m = WorkerMetrics("m")
    held = {"a": SimpleNamespace(entry=SimpleNamespace(entry_id="1000000-0"), prior_token_ids=[],
                                 request=SimpleNamespace(n=3))}

    def delta(index, ids, **kw):
        return RequestDelta(request_id="a", new_token_ids=ids, new_text="", index=index, **kw)

    m.on_report(_report(deltas=[delta(0, [1], num_prompt_tokens=4)]), held, now=1001.0)
    m.on_report(_report(deltas=[delta(1, [2], num_prompt_tokens=4), delta(2, [3], num_prompt_tokens=4),
                                delta(0, [4], finished=True, finish_reason="length")]),
                held, now=1002.0)
    assert value(_samples(m), "fleet:request_success_total", finished_reason="length") == 0
    m.on_report(_report(deltas=[delta(1, [5], finished=True, finish_reason="stop"),
                                delta(2, [6], finished=True, finish_reason="stop")]), held, now=1003.0)
    s = _samples(m)
    assert value(s, "fleet:request_success_total", finished_reason="length") == 1  # sample 0's
    assert value(s, "fleet:request_success_total", finished_reason="stop") == 0
    assert value(s, "fleet:e2e_request_latency_seconds_count") == 1
    assert value(s, "fleet:e2e_request_latency_seconds_sum") == 3.0  # when the last sample ended
    assert value(s, "fleet:time_to_first_token_seconds_count") == 1
    assert value(s, "fleet:inter_token_latency_seconds_count") == 3  # each within its own sample
    assert value(s, "fleet:prompt_tokens_total") == 4  # the shared prompt, once
    assert value(s, "fleet:generation_tokens_total") == 6


def test_fenced_deltas_and_failures_of_unknown_requests_are_not_counted():
    m = WorkerMetrics("m")
    m.on_report(_report(deltas=[RequestDelta(request_id="gone", new_token_ids=[1], new_text="")],
                        failures=[("gone", "invalid_request", "x")]), {}, now=1.0)
    m.on_terminal(SimpleNamespace(code="poison"))
    m.on_terminal(SimpleNamespace(finish_reason="cancelled"))
    s = _samples(m)
    assert value(s, "fleet:generation_tokens_total") == 0
    assert value(s, "fleet:requests_dead_lettered_total") == 0
    assert value(s, "fleet:request_failure_total", code="poison") == 1
    assert value(s, "fleet:requests_cancelled_total") == 1


def test_health_follows_the_worker():
    health = Health(loop_stall_s=30, engine_stall_s=5)
    assert health.live() == (True, "loading") and health.ready() == (False, "loading")
    state = SimpleNamespace(draining=False, engine=SimpleNamespace(alive=True), redis=RedisHealth())
    health.serving(state)
    assert health.live() == (True, "ok") and health.ready() == (True, "ok")
    state.redis.on_error(OutOfMemoryError("command not allowed"), "publishing")
    assert health.ready() == (False, "redis: oom") and health.live()[0]  # restarting won't help
    state.redis.on_ok(wrote=False)
    assert health.ready()[0] is False  # a read does not prove writes work again
    state.redis.on_ok(wrote=True)
    assert health.ready() == (True, "ok")
    health.engine_pass(_report(stats={"num_running": 1}))
    health._engine_pass -= 10  # a step that never returns
    assert not health.live()[0]
    health.engine_pass(_report(stats={}))  # idle: no step expected
    health._engine_pass -= 10
    assert health.live()[0]
    state.draining = True
    assert health.ready() == (False, "draining") and health.live()[0]
    state.engine.alive = False
    assert health.live() == (False, "engine thread died")

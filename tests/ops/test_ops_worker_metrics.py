"""A real worker's /metrics, /healthz and /readyz while it generates through a real Redis."""
from __future__ import annotations

import signal
import time

from ops_harness import http_get, parse_metrics, value
from redis_server import free_port, wait_until

from producer import FleetClient

PROMPTS = [[1, 504, 3058, 314], [1, 42, 43, 44, 45, 46, 47], [1, 9876], [1, 7, 8, 9, 10, 11]]
MAX_TOKENS = [40, 25, 60, 12]


def _start(workers, **options):
    port = free_port()
    worker = workers.start(metrics_port=port, metrics_host="127.0.0.1", **options)
    return worker, f"http://127.0.0.1:{port}"


def _scrape(base: str) -> dict:
    status, body = http_get(base + "/metrics")
    assert status == 200, body
    return parse_metrics(body)


def _scrape_when(base: str, name: str, expected: float) -> dict | None:
    samples = _scrape(base)
    return samples if value(samples, name) == expected else None


def test_counters_and_histograms_follow_the_work(workers, redis_server):
    worker, base = _start(workers)
    assert http_get(base + "/readyz") == (200, "ok\n")
    assert http_get(base + "/healthz") == (200, "ok\n")
    assert http_get(base + "/nope")[0] == 404
    before = _scrape(base)
    assert value(before, "fleet:generation_tokens_total") == 0
    assert value(before, "fleet:num_free_blocks") > 0  # set from the idle engine at start
    received = 0
    seen_running = False
    with FleetClient(redis_server.url) as fleet:
        streams = [fleet.submit(prompt_token_ids=p, max_tokens=n, temperature=0.0,
                                ignore_eos=True) for p, n in zip(PROMPTS, MAX_TOKENS)]
        for stream in streams:
            for token in stream:
                received += len(token.token_ids)
                if not seen_running:  # scrape mid-generation
                    mid = _scrape(base)
                    seen_running = value(mid, "fleet:num_requests_running") >= 1
        results = [s.result(timeout=60) for s in streams]
    assert seen_running, "no scrape saw a running request"
    assert received == sum(MAX_TOKENS) == sum(len(r.token_ids) for r in results)
    after = _scrape(base)
    n = len(PROMPTS)
    assert value(after, "fleet:generation_tokens_total") == received
    assert value(after, "fleet:prompt_tokens_total") == sum(len(p) for p in PROMPTS)
    assert value(after, "fleet:time_to_first_token_seconds_count") == n
    assert value(after, "fleet:e2e_request_latency_seconds_count") == n
    assert value(after, "fleet:request_queue_time_seconds_count") == n
    assert value(after, "fleet:request_success_total", finished_reason="length") == n
    itl = value(after, "fleet:inter_token_latency_seconds_count")
    assert 1 <= itl <= received - n  # one per later delta (a delta may carry several tokens)
    steps = value(after, "fleet:engine_step_seconds_count")
    assert steps >= max(MAX_TOKENS)
    assert value(after, "fleet:engine_step_seconds_bucket", le="+Inf") == steps
    ttft_sum = value(after, "fleet:time_to_first_token_seconds_sum")
    e2e_sum = value(after, "fleet:e2e_request_latency_seconds_sum")
    assert 0 < ttft_sum < e2e_sum
    # idle again: the gauges say so
    assert value(after, "fleet:num_requests_running") == 0
    assert value(after, "fleet:kv_cache_usage_perc") == 0
    assert value(after, "fleet:num_free_blocks") > 0
    assert value(after, "fleet:requests_dead_lettered_total") == 0
    assert value(after, "process_resident_memory_bytes") > 0
    assert all(("model_name", "default") in labels
               for (name, labels) in after if name.startswith("fleet:"))


def test_cancel_and_dead_letter_counters(workers, redis_server, r):
    worker, base = _start(workers)
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(request_id="ops-cancel", prompt_token_ids=PROMPTS[0],
                              max_tokens=2000, temperature=0.0, ignore_eos=True)
        for _ in stream:
            fleet.cancel("ops-cancel")
            break
        assert stream.result(timeout=30).finish_reason == "cancelled"
    r.xadd("fleet:default:requests:default", {"data": b"not json"})
    wait_until(lambda: r.xlen("fleet:default:dead") == 1, what="dead letter")
    samples = wait_until(lambda: _scrape_when(base, "fleet:requests_dead_lettered_total", 1),
                         what="dead-letter counter")
    assert value(samples, "fleet:requests_cancelled_total") == 1
    assert value(samples, "fleet:request_success_total", finished_reason="cancelled") == 1


def test_not_ready_while_draining_but_still_live(workers, redis_server):
    worker, base = _start(workers, drain_grace_s=1)
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(prompt_token_ids=PROMPTS[0], max_tokens=3000, temperature=0.0,
                              ignore_eos=True)
        next(iter(stream))  # generating
        worker.signal(signal.SIGTERM)
        wait_until(lambda: http_get(base + "/readyz") == (503, "draining\n"), timeout=10,
                   what="not ready while draining")
        assert http_get(base + "/healthz")[0] == 200
    assert worker.wait(30) == 0
    time.sleep(0.1)
    assert http_get(base + "/healthz")[0] is None  # gone with the process

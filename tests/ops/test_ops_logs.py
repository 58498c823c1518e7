"""Logs: text or JSON lines with structured fields, a rate limit on floods, the periodic
engine-stats line, and a line per rejection and per dead letter (unit and real worker)."""
from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace

import pytest
from redis_server import wait_until

from gpu_worker import worker_log
from gpu_worker.edge import calls
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.outputs import RequestDelta
from ops_harness import parse_metrics, value
from prometheus_client import generate_latest
from producer import FleetClient, RequestFailed
from shared import keys, logs
from shared.logs import RateLimiter


@pytest.fixture
def log_stream():
    """The root logger configured as a command would, into a buffer; restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()

    def configure(fmt: str, level: str = "info") -> io.StringIO:
        logs.configure(fmt, level, stream=buf)
        return buf

    yield configure
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_lines_carry_ts_level_logger_msg_and_fields(log_stream):
    buf = log_stream("json")
    logging.getLogger("x.y").warning("hello %s", "you", extra={"request_id": "r1", "code": "c"})
    logging.getLogger("x.y").debug("not at info")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("failed")
    first, second = _json_lines(buf.getvalue())
    assert first["level"] == "warning" and first["logger"] == "x.y" and first["msg"] == "hello you"
    assert first["request_id"] == "r1" and first["code"] == "c"
    assert first["ts"].endswith("+00:00") and "T" in first["ts"]
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]


def test_text_lines_put_fields_after_the_message(log_stream, monkeypatch):
    buf = log_stream("text", "debug")
    logging.getLogger("x").info("served", extra={"tenant": "acme"})
    logging.getLogger("x").info("stats: 3 running", extra={"running": 3, "_fields_in_msg": True})
    first, second = buf.getvalue().strip().splitlines()
    assert " INFO x: served tenant=acme" in first
    assert second.endswith("INFO x: stats: 3 running")  # fields not repeated after the message
    monkeypatch.setenv("LOG_FORMAT", "json")
    monkeypatch.setenv("LOG_LEVEL", "warning")
    logs.configure(stream=buf)  # the environment's defaults
    assert logging.getLogger().level == logging.WARNING
    (ours,) = [h for h in logging.getLogger().handlers if getattr(h, "fleet_handler", False)]
    assert isinstance(ours.formatter, logs.JsonFormatter)  # replaced, not added twice
    others = [h for h in logging.getLogger().handlers if h is not ours]
    assert any(isinstance(h, logging.StreamHandler) for h in others)  # pytest's capture survives
    with pytest.raises(ValueError):
        logs.configure("xml")


def test_a_flood_is_rate_limited_and_the_next_line_says_how_many_were_dropped(log_stream):
    buf = log_stream("json")
    now = [0.0]
    limiter = RateLimiter(burst=3, per_s=1.0, clock=lambda: now[0])
    log = logging.getLogger("flood")
    logged = sum(limiter.log(log, logging.WARNING, "dead", "bad %d", i) for i in range(1000))
    assert logged == 3  # a burst, then nothing while the flood lasts
    now[0] = 2.0  # two lines' worth of refill
    assert limiter.log(log, logging.WARNING, "dead", "bad again")
    assert limiter.log(log, logging.WARNING, "other", "another kind has its own bucket")
    lines = _json_lines(buf.getvalue())
    assert [x.get("suppressed") for x in lines] == [None, None, None, 997, None]


def _report(**fields):
    base = dict(deltas=[], failures=[], admitted=[], released=[], stats={}, num_queued=0,
                step_time=0.0)
    return SimpleNamespace(**{**base, **fields})


def _held(request_id: str, tenant: str):
    return SimpleNamespace(entry=SimpleNamespace(entry_id="1-0"), prior_token_ids=[],
                           tenant=tenant, request=SimpleNamespace(request_id=request_id))


def test_rejections_are_counted_by_code_and_never_as_dead_letters(log_stream):
    buf = log_stream("json")
    worker_log.LIMITER._buckets.clear()
    m = WorkerMetrics("m")
    held = {"k1": _held("typo", "acme"), "k2": _held("crash", "globex")}
    m.on_report(_report(failures=[("k1", "empty_prompt", "the prompt is empty"),
                                  ("k2", "internal", "the model step failed")]), held, now=1.0)
    entry = SimpleNamespace(stream="fleet:m:requests:{acme}:default", entry_id="5-1",
                            payload=b'{"request_id": "bad-json", "tenant": "acme", ', deliveries=1)
    dead = calls.dead_letter(WorkerOptions(worker_id="w"), entry, "malformed", "not JSON")
    m.on_dead_letter_writes([("script", "finish", [], []), dead])
    m.on_terminal(SimpleNamespace(request_id="mm", code="tenant_mismatch", message="other"), "acme")
    s = parse_metrics(generate_latest(m.registry).decode())
    assert value(s, "fleet:requests_rejected_total", code="empty_prompt") == 1
    assert value(s, "fleet:requests_rejected_total", code="tenant_mismatch") == 1
    assert value(s, "fleet:requests_rejected_total") == 2
    assert value(s, "fleet:requests_dead_lettered_total", reason="internal") == 1
    assert value(s, "fleet:requests_dead_lettered_total", reason="malformed") == 1
    assert value(s, "fleet:requests_dead_lettered_total", reason="poison") == 0  # exists at 0
    assert value(s, "fleet:request_failure_total") == 3  # every typed failure, both kinds
    lines = {x["request_id"]: x for x in _json_lines(buf.getvalue())}
    assert lines["typo"]["msg"].startswith("request rejected: empty_prompt")
    assert lines["typo"]["level"] == "info" and lines["typo"]["tenant"] == "acme"
    assert lines["crash"]["level"] == "warning" and lines["crash"]["code"] == "internal"
    assert lines["crash"]["msg"].startswith("request dead-lettered") and lines["crash"]["tenant"] == "globex"
    assert lines["bad-json"]["code"] == "malformed" and lines["bad-json"]["entry_id"] == "5-1"
    assert lines["mm"]["code"] == "tenant_mismatch" and lines["mm"]["tenant"] == "acme"


def test_the_stats_line_reports_load_throughput_prefix_hits_and_acceptance(log_stream):
    buf = log_stream("json")
    m = WorkerMetrics("m")
    now = [100.0]
    stats = worker_log.StatsLogger(m.registry, 10.0, clock=lambda: now[0])
    m.on_step(0.01, {"num_running": 3, "num_waiting": 1, "kv_usage": 0.25,
                     "prefix_cache_queries": 10, "prefix_cache_hits": 4,
                     "spec_drafted_tokens": {"ngram": 20}, "spec_accepted_tokens": {"ngram": 15}},
              num_queued=2)
    for i in range(50):
        m.on_delta(RequestDelta(request_id=f"r{i % 3}", new_token_ids=[1, 2], new_text="",
                                num_prompt_tokens=100), 90.0, 100.0)
    now[0] = 110.0
    fields = stats.tick()
    assert fields["running"] == 3 and fields["waiting"] == 3 and fields["kv_cache_usage"] == 0.25
    assert fields["generation_tokens_per_s"] == 10.0  # 100 tokens in 10 s
    assert fields["prompt_tokens_per_s"] == 30.0  # three requests' prompts of 100
    assert fields["prefix_cache_hit_rate"] == 0.4 and fields["spec_acceptance"] == 0.75
    (line,) = _json_lines(buf.getvalue())
    assert line["logger"] == "gpu_worker.stats" and line["generation_tokens_per_s"] == 10.0
    assert "running 3 reqs, waiting 3 reqs, KV cache 25.0%" in line["msg"]
    assert "prefix cache hit rate 40.0%, spec acceptance 75.0%" in line["msg"]
    m.on_step(0.0, {"num_running": 0, "num_waiting": 0, "kv_usage": 0.0})
    now[0] = 120.0
    assert stats.tick()["generation_tokens_per_s"] == 0.0  # the first idle interval is logged
    now[0] = 130.0
    assert stats.tick() is None  # then quiet while idle
    assert len(_json_lines(buf.getvalue())) == 2


def test_a_real_worker_logs_json_stats_rejections_and_dead_letters(workers, redis_server, r):
    worker = workers.start(log_format="json", log_stats_interval=0.3)
    stream = keys.stream_key("default", "default", "default")
    with FleetClient(redis_server.url) as fleet:
        with pytest.raises(RequestFailed) as err:
            fleet.generate(request_id="typo-1", prompt="", max_tokens=4, timeout=30)
        assert err.value.code == "empty_prompt"
        assert fleet.generate(prompt_token_ids=[1, 2, 3], max_tokens=8, timeout=30).token_ids
        r.xadd(stream, {"data": '{"request_id": "mal-1", "max_tokens": "x"}'})
        wait_until(lambda: r.xlen(keys.dead_letter_key("default")) == 1, what="dead letter")

    def lines() -> list[dict]:
        return _json_lines(worker.output())

    wait_until(lambda: any(x.get("generation_tokens_per_s") for x in lines()), timeout=10,
               what="a stats line with tokens/s")
    by_id = {x.get("request_id"): x for x in lines()}
    assert by_id["typo-1"]["code"] == "empty_prompt" and by_id["typo-1"]["tenant"] == "default"
    assert by_id["typo-1"]["level"] == "info"
    assert by_id["mal-1"]["code"] == "malformed" and by_id["mal-1"]["level"] == "warning"
    (dead,) = r.xrange(keys.dead_letter_key("default"))
    assert dead[1][b"code"] == b"malformed"  # the typo is not a dead letter


def test_the_exporter_logs_new_dead_letters_once_per_scrape(redis_server, r, log_stream):
    from producer.exporter import QueueCollector

    buf = log_stream("json")
    collector = QueueCollector(redis_server.url, ["default"])
    list(collector.collect())  # the first scrape only learns the length
    for i in range(3):
        r.xadd(keys.dead_letter_key("default"), {"code": "poison", "n": i})
    list(collector.collect())
    list(collector.collect())  # nothing new: no line
    (line,) = [x for x in _json_lines(buf.getvalue()) if x["logger"] == "producer.exporter"]
    assert line["level"] == "warning" and line["new_dead_letters"] == 3
    assert line["msg"] == "3 new dead letters of default (3 in fleet:default:dead)"


def test_a_flood_of_bad_entries_costs_a_few_lines_not_one_each(workers, redis_server, r):
    import time

    worker = workers.start()
    stream = keys.stream_key("default", "default", "default")
    started = time.monotonic()
    pipe = r.pipeline(transaction=False)
    for i in range(400):
        pipe.xadd(stream, {"data": f"not json {i}"})
    pipe.execute()
    wait_until(lambda: r.xlen(keys.dead_letter_key("default")) == 400, timeout=60,
               what="every bad entry dead-lettered")
    wait_until(lambda: r.xlen(stream) == 0, what="every entry acknowledged")
    elapsed = time.monotonic() - started
    lines = [x for x in worker.output().splitlines() if "request dead-lettered" in x]
    assert 20 <= len(lines) <= 20 + elapsed + 1, (len(lines), elapsed)
    with FleetClient(redis_server.url) as fleet:  # and it keeps serving
        assert fleet.generate(prompt_token_ids=[1, 2, 3], max_tokens=3, timeout=30).token_ids

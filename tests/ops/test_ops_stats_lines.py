"""The gateway's and the exporter's periodic stats lines: their figures over a fake clock,
and the JSON lines of a real ``fleet gateway`` and ``fleet exporter`` (real Redis)."""
from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from redis_server import REPO, free_port, subprocess_env, wait_until

from producer.exporter import families
from producer.gateway.metrics import GatewayMetrics, MetricsMiddleware
from producer.stats_log import ExporterStats, GatewayStats, quantile
from shared import keys, logs

sys.path.insert(0, str(REPO / "tests" / "gateway"))
from gateway_harness import start_gateway  # noqa: E402


@pytest.fixture
def json_log():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    logs.configure("json", "info", stream=buf)
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def _lines(text: str, logger: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("logger") == logger:
            out.append(obj)
    return out


def test_quantiles_interpolate_in_their_bucket():
    inf = float("inf")
    assert quantile(0.5, {0.1: 0, 0.25: 16, 2.5: 16, 5.0: 20, inf: 20}) == pytest.approx(0.19375)
    assert quantile(0.99, {0.1: 0, 0.25: 16, 2.5: 16, 5.0: 20, inf: 20}) == pytest.approx(4.875)
    assert quantile(0.99, {1.0: 1, inf: 10}) == 1.0  # past the last bound: that bound
    assert quantile(0.5, {1.0: 0, inf: 0}) is None


def test_the_gateway_line_counts_outcomes_and_durations_but_not_probes(json_log):
    m = GatewayMetrics()
    now, batches = [50.0], [2]
    stats = GatewayStats(m.registry, 10.0, clock=lambda: now[0],
                         batches_running=lambda: batches[0])
    chat = "/v1/chat/completions"
    for status, seconds, n in (("200", 0.2, 16), ("429", 3.0, 3), ("503", 3.0, 1)):
        for _ in range(n):
            m.requests.labels(chat, "POST", status).inc()
            m.duration.labels(chat, "POST").observe(seconds)
    for _ in range(100):  # probes and scrapes are not traffic
        m.requests.labels("/health", "GET", "200").inc()
        m.duration.labels("/metrics", "GET").observe(0.001)
    m.in_flight.labels(chat).inc()
    m.streams_open.inc()
    now[0] = 60.0
    f = stats.tick()
    assert f["requests"] == 20 and f["requests_per_s"] == 2.0
    assert (f["requests_2xx_per_s"], f["requests_4xx_per_s"], f["requests_5xx_per_s"]) == (1.6, 0.3, 0.1)
    assert f["p50_ms"] == pytest.approx(193.8, abs=0.1) and f["p99_ms"] == 4875.0
    assert (f["in_flight"], f["streams_open"], f["batches_running"]) == (1, 1, 2)
    (line,) = _lines(json_log.getvalue(), "producer.gateway.stats")
    assert line["msg"].startswith("gateway stats: 2.0 req/s (2xx 1.6, 4xx 0.3, 5xx 0.1), in flight 1")
    assert line["p99_ms"] == 4875.0 and "p99 4875.0 ms, batches running 2" in line["msg"]
    m.in_flight.labels(chat).dec()
    m.streams_open.dec()
    now[0] = 70.0
    assert stats.tick()["batches_running"] == 2  # a batch still runs: not idle
    batches[0] = 0
    now[0] = 80.0
    idle = stats.tick()  # the first idle interval is logged
    assert idle["requests"] == 0 and idle["p50_ms"] is None
    now[0] = 90.0
    assert stats.tick() is None  # then quiet
    assert "p50 n/a, p99 n/a," in _lines(json_log.getvalue(), "producer.gateway.stats")[-1]["msg"]


def test_the_middleware_counts_an_event_stream_while_it_is_open():
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import StreamingResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    metrics, seen = GatewayMetrics(), []

    async def events():
        seen.append(metrics.streams_open._value.get())
        yield b"data: [DONE]\n\n"

    async def sse(request):
        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/s", sse)],
                    middleware=[Middleware(MetricsMiddleware, metrics=metrics)])
    with TestClient(app) as client:
        assert client.get("/s").status_code == 200
        assert client.get("/nope").status_code == 404
    assert seen == [1.0] and metrics.streams_open._value.get() == 0


def _report(lag: int, pending: int, dead: int, draining: str = "0") -> dict:
    def numbers(lag, pending):
        return {"length": lag + pending, "lag": lag, "pending": pending, "consumers": 1}

    return {"model": "default", "tenants": {"acme": {"default": numbers(lag, pending),
                                                     "high": numbers(1, 0)},
                                            "globex": {"default": numbers(lag, 0)}},
            "legacy": {}, "streams": {}, "dead_letters": dead, "invalid_tenants": [],
            "workers": {"w1": {"alive": True, "draining": 0},
                        "w2": {"alive": True, "draining": draining},
                        "w3": {"alive": False}}}


def test_the_exporter_line_sums_the_backlog_per_lane_and_counts_workers(json_log):
    state = {"reports": [_report(3, 2, 4, draining="1")]}

    class Fake:
        def collect(self):
            from prometheus_client.core import GaugeMetricFamily
            up = GaugeMetricFamily("fleet:queue_up", "up")
            up.add_metric([], 1)
            yield up
            yield from families(state["reports"])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fake())
    now = [0.0]
    stats = ExporterStats(registry, 10.0, clock=lambda: now[0])
    f = stats.tick()
    assert f["up"] and f["backlog_total"] == 9  # acme 3+2 and 1 high, globex 3
    assert f["models"]["default"] == {"backlog": {"default": 8, "high": 1}, "workers_alive": 2,
                                      "workers_draining": 1, "dead_letters": 4}
    (line,) = _lines(json_log.getvalue(), "producer.exporter.stats")
    assert line["msg"] == ("exporter stats: default: backlog 9 (default 8, high 1), workers 2 "
                           "alive, 1 draining, dead letters 4")
    state["reports"] = [{**_report(0, 0, 4, draining="1"), "tenants": {}}]
    assert stats.tick()["backlog_total"] == 0  # the one idle line
    assert stats.tick() is None  # quiet while nothing changes
    state["reports"] = [{**_report(0, 0, 5, draining="1"), "tenants": {}}]
    assert stats.tick()["models"]["default"]["dead_letters"] == 5  # a new dead letter: a line


def test_a_real_gateway_logs_json_stats_lines(redis_server, tmp_path):
    gateway = start_gateway(redis_server.url, tmp_path / "gw.log", free_port(), "--log-format",
                            "json", "--log-stats-interval", "0.3", log_level="info")
    try:
        for _ in range(3):
            assert httpx.get(gateway.url + "/v1/models").status_code == 200
        for _ in range(2):
            answer = httpx.post(gateway.url + "/v1/chat/completions", content=b"{not json")
            assert answer.status_code == 400

        def lines():
            return _lines(gateway.output(), "producer.gateway.stats")

        wait_until(lambda: sum(x["requests"] for x in lines()) >= 5 and lines()[-1]["requests"] == 0,
                   timeout=15, what="stats lines with the 5 requests, then an idle one")
        busy = [x for x in lines() if x["requests"]]
        assert sum(x["requests"] for x in busy) == 5
        assert sum(x["requests_4xx_per_s"] for x in busy) > 0 and all(x["p99_ms"] for x in busy)
        assert all(x["in_flight"] == 0 and x["batches_running"] == 0 for x in lines())
        count = len(lines())
        time.sleep(1.0)  # three more intervals, idle, /health polled meanwhile
        httpx.get(gateway.url + "/health")
        assert len(lines()) == count  # quiet while idle
    finally:
        gateway.stop()


def test_a_real_exporter_logs_json_stats_lines(redis_server, r, tmp_path):
    log = tmp_path / "exporter.log"
    cmd = [sys.executable, "-m", "producer.cli", "exporter", "--redis-url", redis_server.url,
           "--port", str(free_port()), "--host", "127.0.0.1", "--log-format", "json",
           "--log-level", "info", "--log-stats-interval", "0.3"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)

    def lines():
        return _lines(log.read_text(errors="replace"), "producer.exporter.stats")

    try:
        wait_until(lambda: lines(), timeout=30, what="a first stats line")
        assert lines()[0]["backlog_total"] == 0 and lines()[0]["up"] is True
        for i in range(3):
            r.xadd(keys.stream_key("default", "default", "default"), {"data": f"x{i}"})
        r.xadd(keys.dead_letter_key("default"), {"code": "poison"})
        wait_until(lambda: lines()[-1]["backlog_total"] == 3, timeout=15, what="the backlog")
        model = lines()[-1]["models"]["default"]
        assert model["backlog"]["default"] == 3 and model["dead_letters"] == 1
        assert model["workers_alive"] == 0
        assert "default: backlog 3 (" in lines()[-1]["msg"]
    finally:
        proc.terminate()
        proc.wait(15)

"""The gateway's ``/metrics`` (answers by route and status, latency, in flight) and its JSON
log lines, against a real ``fleet gateway`` process and a real redis-server."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
from gateway_harness import start_gateway
from redis_server import RedisServer, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_harness import parse_metrics, value  # noqa: E402


def test_the_gateway_counts_answers_by_route_and_status_and_logs_json(tmp_path):
    server = RedisServer().start()
    gateway = start_gateway(server.url, tmp_path / "gw.log", free_port(), "--log-format", "json",
                            log_level="info")
    try:
        for _ in range(3):
            assert httpx.get(gateway.url + "/v1/models").status_code == 200
        assert httpx.get(gateway.url + "/no/such/path/1").status_code == 404
        assert httpx.get(gateway.url + "/no/such/path/2").status_code == 404
        assert httpx.delete(gateway.url + "/v1/models").status_code == 405
        assert httpx.post(gateway.url + "/v1/chat/completions", content=b"{").status_code == 400
        answer = httpx.get(gateway.url + "/metrics")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        s = parse_metrics(answer.text)
        assert value(s, "fleet:gateway_requests_total", route="/v1/models", method="GET",
                     status="200") == 3
        assert value(s, "fleet:gateway_requests_total", route="other", status="404") == 2
        assert value(s, "fleet:gateway_requests_total", route="/v1/models", status="405") == 1
        assert value(s, "fleet:gateway_requests_total", route="/v1/chat/completions",
                     status="400") == 1
        assert value(s, "fleet:gateway_request_duration_seconds_count", route="/v1/models") == 4
        assert value(s, "fleet:gateway_requests_in_flight", route="/metrics") == 1  # this one
        assert {labels for (name, labels) in s if name == "fleet:gateway_requests_total"} \
            and not any("/no/such" in str(labels) for (_, labels) in s)  # bounded label values
    finally:
        gateway.stop()
        server.stop()
    lines = [json.loads(x) for x in gateway.output().splitlines() if x.strip()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    assert any(x["logger"] == "uvicorn.access" and "/v1/models" in x["msg"] for x in lines)
    failed = [x for x in lines if x["logger"] == "producer.gateway.requests"]
    assert [(x["route"], x["status"], x["level"]) for x in failed] == [
        ("other", 404, "info"), ("other", 404, "info"), ("/v1/models", 405, "info"),
        ("/v1/chat/completions", 400, "info")]
    assert failed[-1]["code"] and failed[-1]["msg"].startswith("request failed: POST")

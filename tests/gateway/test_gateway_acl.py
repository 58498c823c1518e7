"""The gateway as the shipped ``fleet-gateway`` ACL user (ops/redis/users.acl on a real
redis-server, TLS where openssl can make a certificate): ready, serving, and its log (at
debug level) never shows the password."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from fleet_harness import WorkerFactory
from gateway_harness import start_gateway
from redis_server import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_harness import AclRedisServer, make_tls_cert, render_acl  # noqa: E402


@pytest.fixture
def acl_fleet(tmp_path, tiny_model):
    acl = tmp_path / "users.acl"
    server = AclRedisServer(acl, render_acl(acl), make_tls_cert(tmp_path)).start()
    workers = WorkerFactory(server, tiny_model, tmp_path)  # as fleet-worker
    worker = workers.start(wait=False)
    gateway = start_gateway(server.url_for("fleet-gateway"), tmp_path / "gateway.log",
                            free_port(), "--served-model", "tiny=default", log_level="debug")
    workers.wait_ready(worker)
    yield server, gateway
    gateway.stop()
    workers.cleanup()
    server.stop()


def test_ready_and_serving_as_the_shipped_gateway_user(acl_fleet):
    server, gateway = acl_fleet
    reply = httpx.get(gateway.url + "/ready", timeout=30)
    assert reply.status_code == 200, reply.text
    # the registry, the queue and the count of live workers are readable with its commands
    assert reply.json() == {"status": "ready", "queued": {"tiny": 0}, "workers": {"tiny": 1}}

    body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    reply = httpx.post(gateway.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
    with httpx.stream("POST", gateway.url + "/v1/completions", json={**body, "stream": True},
                      timeout=60) as stream:
        assert stream.status_code == 200
        assert stream.read().endswith(b"data: [DONE]\n\n")

    gateway.stop()  # shutdown logs too
    log = gateway.output()
    assert "fleet-gateway:***@" in log  # the startup line names the URL, redacted
    assert server.passwords["fleet-gateway"] not in log
    assert "NOPERM" not in log and "Traceback" not in log

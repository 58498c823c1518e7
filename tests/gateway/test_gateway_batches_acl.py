"""A batch through the gateway as the shipped ``fleet-gateway`` ACL user (ops/redis/users.acl
rendered onto a real redis-server): files, batches and the runner need nothing more."""
from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

from fleet_harness import WorkerFactory
from gateway_harness import start_gateway
from redis_server import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_harness import AclRedisServer, make_tls_cert, render_acl  # noqa: E402


def test_a_batch_as_the_shipped_gateway_user(tmp_path, tiny_model):
    from openai import OpenAI

    acl = tmp_path / "users.acl"
    server = AclRedisServer(acl, render_acl(acl), make_tls_cert(tmp_path)).start()
    workers = WorkerFactory(server, tiny_model, tmp_path)
    gateway = None
    try:
        workers.start()
        gateway = start_gateway(server.url_for("fleet-gateway"), tmp_path / "gateway.log",
                                free_port(), "--served-model", "tiny=default")
        client = OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=60)
        rows = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "tiny", "prompt": "Once upon", "max_tokens": 3}}
                for i in range(3)]
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions",
                                      completion_window="24h")
        deadline = time.monotonic() + 90
        while (batch := client.batches.retrieve(batch.id)).status != "completed":
            assert time.monotonic() < deadline, (batch, gateway.output()[-2000:])
            time.sleep(0.2)
        assert batch.output_file_id, (batch, gateway.output()[-3000:])
        lines = client.files.content(batch.output_file_id).text.splitlines()
        assert sorted(json.loads(x)["custom_id"] for x in lines) == ["c0", "c1", "c2"]
        gateway.stop()
        assert "NOPERM" not in gateway.output() and "permission" not in gateway.output().lower()
    finally:
        if gateway is not None:
            gateway.stop()
        workers.cleanup()
        server.stop()

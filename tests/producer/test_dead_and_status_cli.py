"""``fleet dead list|requeue|purge`` and ``fleet status``'s exits and messages, on a real
Redis (and a real worker where a requeued request must be generated)."""
from __future__ import annotations

import json
import subprocess
import sys

from redis_server import REPO, free_port, subprocess_env

from producer import FleetClient
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]


def _fleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)


def _dead_letter(r, request_id: str, code: str = "poison") -> str:
    """A dead letter as a worker writes it, with the typed failure its client was sent."""
    stream = keys.stream_key("default", "default", "batch")
    payload = json.dumps({"request_id": request_id, "prompt_token_ids": PROMPT,
                          "max_tokens": 3, "ignore_eos": True, "priority": "batch"})
    r.hset(keys.state_key("default", request_id), "result", json.dumps(
        {"type": "failure", "request_id": request_id, "code": code, "message": "dead",
         "retryable": False}))
    return r.xadd(keys.dead_letter_key("default"), {
        "stream": stream, "entry_id": "1-0", "code": code, "message": "too many deliveries",
        "deliveries": 5, "worker_id": "w9", "data": payload}).decode()


def test_dead_list_requeue_purge(redis_server, r, workers):
    url = redis_server.url
    first, second, third = (_dead_letter(r, f"dead-{i}") for i in range(3))
    table = _fleet("dead", "list", "--redis-url", url)
    assert table.returncode == 0 and first in table.stdout and "poison" in table.stdout
    rows = json.loads(_fleet("dead", "list", "--json", "--redis-url", url).stdout)
    assert [x["id"] for x in rows] == [first, second, third]
    assert rows[0]["deliveries"] == 5 and rows[0]["request_id"] == "dead-0"

    refused = _fleet("dead", "requeue", "--all", "--redis-url", url)
    assert refused.returncode == 2 and "--all --yes" in refused.stderr
    assert r.xlen(keys.dead_letter_key("default")) == 3
    missing = _fleet("dead", "purge", "0-1", "--redis-url", url)
    assert missing.returncode == 1 and "no dead letter 0-1" in missing.stderr

    requeued = _fleet("dead", "requeue", first, "--redis-url", url)
    assert requeued.returncode == 0 and "requeued 1 of 1" in requeued.stdout, requeued.stderr
    assert r.xlen(keys.dead_letter_key("default")) == 2
    workers.start()
    with FleetClient(url) as fleet:  # generated now, not the stored failure again
        result = fleet.watch("dead-0").result(timeout=60)
    assert len(result.token_ids) == 3

    purged = _fleet("dead", "purge", "--all", "--yes", "--redis-url", url)
    assert purged.returncode == 0 and "purged 2 of 2" in purged.stdout
    assert r.xlen(keys.dead_letter_key("default")) == 0


def test_status_json_numbers_draining_and_unknown_namespace(redis_server, r):
    url = redis_server.url
    r.zadd(keys.workers_key("default"), {"w1": 1.0})
    r.hset(keys.worker_key("default", "w1"), mapping={"running": 2, "waiting": 0,
                                                      "kv_usage": 0.25, "draining": 1})
    report = json.loads(_fleet("status", "--json", "--redis-url", url).stdout)
    w1 = report["workers"]["w1"]
    assert (w1["running"], w1["kv_usage"], w1["draining"]) == (2, 0.25, 1)
    assert all(isinstance(v, int) for lanes in report["tenants"].values()
               for s in lanes.values() for v in s.values())
    table = _fleet("status", "--redis-url", url)
    assert "draining" in table.stdout and "warning" not in table.stderr
    assert table.stdout.splitlines()[-1].split()[:3] == ["w1", "yes", "yes"]
    other = _fleet("status", "--json", "--model-name", "typo", "--redis-url", url)
    assert other.returncode == 0 and json.loads(other.stdout)["model"] == "typo"
    assert "warning: nothing under the model namespace 'typo'" in other.stderr


def test_status_and_dead_with_redis_down_are_one_line():
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"
    for args in (("status",), ("dead", "list")):
        run = _fleet(*args, "--redis-url", url)
        assert run.returncode == 3, run.stderr
        assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
        assert "redis://:***@127.0.0.1" in run.stderr and "pw@" not in run.stderr

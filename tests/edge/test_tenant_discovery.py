"""Tenants come and go without a restart: a worker already running serves a tenant
registered after it started (`fleet tenants add`), and stops reading one removed."""
from __future__ import annotations

import json
import time

from redis_server import wait_until

from producer.cli import main
from shared import keys


def _enqueue(r, tenant: str, request_id: str) -> None:
    r.xadd(keys.stream_key("default", tenant, "default"), {keys.STREAM_FIELD: json.dumps({
        "request_id": request_id, "prompt_token_ids": [1, 2], "max_tokens": 3,
        "temperature": 0, "ignore_eos": True})})


def test_tenants_added_and_removed_while_a_worker_runs(workers, redis_server, r):
    url = redis_server.url
    assert main(["tenants", "add", "first", "--redis-url", url]) == 0
    worker = workers.start(tenants_refresh_s=0.5)
    _enqueue(r, "first", "f1")
    wait_until(lambda: r.hget(keys.state_key("first", "f1"), "result"), what="first served")
    assert main(["tenants", "add", "newco", "--lanes", "default", "--redis-url", url]) == 0
    _enqueue(r, "newco", "n1")
    wait_until(lambda: r.hget(keys.state_key("newco", "n1"), "result"), timeout=30,
               what="a tenant registered after the worker started, served")
    assert main(["tenants", "remove", "newco", "--redis-url", url]) == 0
    time.sleep(1.5)  # past a refresh
    _enqueue(r, "newco", "n2")
    time.sleep(2.0)
    assert r.hget(keys.state_key("newco", "n2"), "result") is None
    assert r.xlen(keys.stream_key("default", "newco", "default")) == 1  # left, untouched
    assert worker.proc.poll() is None and "no longer serving newco" in worker.output()

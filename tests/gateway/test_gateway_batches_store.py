"""The batch store on a real Redis and on a real 3-master Redis Cluster: every script and
transaction stays in the tenant's slot, a line is recorded once, files expire."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from redis_cluster import RedisCluster
from redis_server import RedisServer

from producer.gateway.batch_store import CHUNK, Store, new_id, render
from shared import connect, keys


@pytest.fixture(scope="module", params=["single", "cluster"])
def url(request):
    server = RedisServer() if request.param == "single" else RedisCluster(masters=3, replicas=0)
    server.start()
    yield server.url
    server.stop()


async def _scenario(url: str) -> dict:
    redis = await connect.async_client(url)
    store = Store(redis)
    try:
        now = int(time.time())
        meta = {"id": new_id("file"), "created_at": now, "purpose": "batch"}
        lines = [json.dumps({"custom_id": str(i)}).encode() for i in range(CHUNK + 7)]
        await store.put_file("acme", meta, lines, ttl_s=3600)
        read = [line async for chunk in store.lines("acme", meta["id"]) for line in chunk]
        fixed = {"id": new_id("batch"), "endpoint": "/v1/completions", "created_at": now,
                 "input_file_id": meta["id"], "completion_window": "24h",
                 "expires_at": now + 86400, "output_file_id": new_id("file"),
                 "error_file_id": new_id("file"), "metadata": None}
        await store.put_batch("acme", fixed)
        firsts = [await store.record("acme", fixed, 1, "a", True) for _ in range(2)]
        await store.record("acme", fixed, 2, "bb", False)
        leased = [await store.lease("acme", fixed["id"], owner, 5) for owner in ("x", "y", "x")]
        out = {"id": fixed["output_file_id"], "created_at": now, "purpose": "batch_output"}
        await store.finish("acme", fixed["id"], "completed", [out])
        return {"read": read, "lines": lines, "firsts": firsts, "leased": leased,
                "state": await store.batch("acme", fixed["id"]),
                "active": await store.active("acme"),
                "files": [f["id"] for f in await store.files("acme")],
                "other": await store.files("globex"),
                "ttl": await redis.ttl(keys.file_key("acme", meta["id"], "lines")),
                "output": await redis.lrange(keys.file_key("acme", out["id"], "lines"), 0, -1),
                "meta": meta, "out": out}
    finally:
        await redis.aclose()


def test_store_round_trip(url):
    got = asyncio.run(_scenario(url))
    assert got["read"] == got["lines"]
    assert got["firsts"] == [True, False]  # the same line recorded twice is kept once
    assert got["leased"] == [True, False, True]
    batch = render(got["state"])
    assert batch["status"] == "completed" and batch["completed_at"]
    assert batch["request_counts"] == {"total": 0, "completed": 1, "failed": 1}
    assert batch["output_file_id"] == got["out"]["id"] and batch["error_file_id"] is None
    assert got["active"] == [] and got["other"] == []
    assert set(got["files"]) == {got["meta"]["id"], got["out"]["id"]}
    assert 3500 < got["ttl"] <= 3600
    assert got["output"] == [b"a"]

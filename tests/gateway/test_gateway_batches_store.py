"""The batch store on a real Redis and on a real 3-master Redis Cluster: every script and
transaction stays in the tenant's slot, a line is recorded once and only while the batch
runs, the status moves only along its lifecycle, files expire."""
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
        early = await store.record("acme", fixed, 1, "early", True)  # still validating
        moves = [await store.move("acme", fixed["id"], "in_progress", ("validating",), total=2)]
        firsts = [await store.record("acme", fixed, 1, "a", True) for _ in range(2)]
        await store.record("acme", fixed, 2, "bb", False)
        leased = [await store.lease("acme", fixed["id"], owner, 5) for owner in ("x", "y", "x")]
        moves.append(await store.move("acme", fixed["id"], "finalizing",
                                      ("in_progress", "cancelling"), ending="completed"))
        late = await store.record("acme", fixed, 3, "late", True)  # after finalizing: refused
        moves.append(await store.move("acme", fixed["id"], "cancelling",
                                      ("validating", "in_progress")))  # too late to cancel
        moves.append(await store.move("acme", new_id("batch"), "cancelling", ("in_progress",)))
        out = {"id": fixed["output_file_id"], "created_at": now, "purpose": "batch_output"}
        ends = [await store.finish("acme", fixed["id"], "completed", [out]),
                await store.finish("acme", fixed["id"], "cancelled", [])]  # ended once
        return {"read": read, "lines": lines, "firsts": firsts, "leased": leased,
                "early": early, "late": late, "moves": moves, "ends": ends,
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
    assert got["early"] is False and got["late"] is False  # only a running batch records
    assert got["moves"] == [(True, "validating"), (True, "in_progress"), (False, "finalizing"),
                            (False, "")]
    assert got["ends"] == [True, False]
    assert got["leased"] == [True, False, True]
    batch = render(got["state"])
    assert batch["status"] == "completed" and batch["completed_at"]
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert batch["finalizing_at"] and batch["cancelling_at"] is None
    assert got["state"]["ending"] == "completed"
    assert batch["output_file_id"] == got["out"]["id"] and batch["error_file_id"] is None
    assert got["active"] == [] and got["other"] == []
    assert set(got["files"]) == {got["meta"]["id"], got["out"]["id"]}
    assert 3500 < got["ttl"] <= 3600
    assert got["output"] == [b"a"]

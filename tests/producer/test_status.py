"""``fleet status`` with tenants: each registered tenant's lanes, the old shared streams
while they hold work, per-lane totals -- on one server and on a cluster from any node."""
from __future__ import annotations

import asyncio
import json

import pytest

from producer.cli import main
from producer.status import collect, render
from shared import keys, tenants
from shared.tenants import TenantConfig
from tests.redis_cluster import RedisCluster

ZERO = {"length": 0, "lag": 0, "pending": 0, "consumers": 0}


def _register(client, *configs: TenantConfig) -> None:
    for config in configs:
        client.hset(keys.tenants_key(), config.name, tenants.encode(config))


def _fill(client) -> None:
    """acme: 3 waiting in default, 1 of them taken by a worker; 1 left in batch (a lane it
    no longer has); globex: nothing yet; the old shared high stream: 2 never read."""
    _register(client, TenantConfig(name="acme", lanes=["high", "default"]),
              TenantConfig(name="globex", lanes=["batch"]))
    default = keys.stream_key("default", "acme", "default")
    client.xgroup_create(default, keys.GROUP, id="0", mkstream=True)
    for _ in range(3):
        client.xadd(default, {keys.STREAM_FIELD: b"{}"})
    client.xreadgroup(keys.GROUP, "w1", {default: ">"}, count=1)
    client.xadd(keys.stream_key("default", "acme", "batch"), {keys.STREAM_FIELD: b"{}"})
    for _ in range(2):
        client.xadd(keys.legacy_stream_key("default", "high"), {keys.STREAM_FIELD: b"{}"})
    client.zadd(keys.workers_key("default"), {"w1": 1.0})
    client.hset(keys.worker_key("default", "w1"), mapping={"running": "1", "waiting": "0"})


def _check(report: dict) -> None:
    assert report["tenants"] == {
        "acme": {"high": ZERO,
                 "default": {"length": 3, "lag": 2, "pending": 1, "consumers": 1},
                 "batch": {"length": 1, "lag": 1, "pending": 0, "consumers": 0}},
        "globex": {"batch": ZERO}}
    assert report["legacy"] == {"high": {"length": 2, "lag": 2, "pending": 0, "consumers": 0}}
    assert report["streams"] == {
        "high": {"length": 2, "lag": 2, "pending": 0, "consumers": 0},
        "default": {"length": 3, "lag": 2, "pending": 1, "consumers": 1},
        "batch": {"length": 1, "lag": 1, "pending": 0, "consumers": 0}}
    assert report["workers"]["w1"]["alive"] and report["workers"]["w1"]["running"] == 1


def test_backlog_per_tenant_and_lane(redis_server, r, capsys):
    empty = asyncio.run(collect(redis_server.url, "default"))
    assert empty["tenants"] == {"default": dict.fromkeys(keys.LANES, ZERO)}  # the implicit one
    assert empty["legacy"] == {} and empty["invalid_tenants"] == []
    _fill(r)
    r.hset(keys.tenants_key(), "broken", b"{not json")
    report = asyncio.run(collect(redis_server.url, "default"))
    _check(report)
    assert report["invalid_tenants"] == ["broken"]
    text = render(report)
    assert "acme                  default         3       2        1          1" in text
    assert "(old shared stream)   high            2       2" in text
    assert "invalid registry entries (ignored): broken" in text
    assert main(["status", "--json", "--redis-url", redis_server.url]) == 0
    assert json.loads(capsys.readouterr().out)["tenants"] == report["tenants"]


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster().start()
    yield c
    c.stop()


def test_on_a_cluster_from_any_node(cluster, capsys):
    with cluster.client() as client:
        _fill(client)
    for node in (cluster.nodes[0], cluster.nodes[-1]):  # a master and a replica
        _check(asyncio.run(collect(node.url, "default")))
    assert main(["status", "--redis-url", cluster.nodes[-1].url]) == 0
    assert "globex                batch" in capsys.readouterr().out

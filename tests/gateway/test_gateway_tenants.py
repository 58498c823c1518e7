"""API keys map to tenants of the fleet's registry: an unregistered tenant (or one not
allowed the gateway's lane) is refused with a 403 before anything is enqueued, a tenant
added with ``fleet tenants add`` is served within seconds, each tenant enqueues into (and
is bounded by) its own stream -- on one server, and on a Redis Cluster given one node."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import httpx
import openai
import pytest
import redis
from conftest import QUEUE_BOUND
from fleet_harness import WorkerFactory
from gateway_harness import check_error, register_tenants, start_gateway
from redis_server import free_port, wait_until

from producer.cli import main
from producer.tenants_cli import setuser_args
from shared import keys
from tests.redis_cluster import RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_harness import render_acl  # noqa: E402

IDLE = {"model": "idle", "prompt": "hi", "max_tokens": 1}


def _post(url: str, key: str, body: dict = IDLE, timeout: float = 30) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=timeout,
                      headers={"Authorization": f"Bearer {key}"})


def _admitted(url: str, key: str) -> None:
    """The call passed every check and was enqueued: no worker serves ``idle``, so it waits
    (this client leaves after 3 s, and the gateway cancels the request)."""
    try:
        reply = _post(url, key, timeout=3)
    except httpx.ReadTimeout:
        return
    raise AssertionError(f"answered {reply.status_code}: {reply.text}")


def _refused(reply: httpx.Response, status: int, code: str) -> dict:
    assert reply.status_code == status, reply.text
    error = check_error(status, reply.headers, reply.content)
    assert error["code"] == code
    return error


def test_unregistered_tenant_or_lane_is_403_and_nothing_is_enqueued(gateway_url, fleet_redis):
    error = _refused(_post(gateway_url, "sk-ghost"), 403, "tenant_not_registered")
    assert "'ghost' is not registered" in error["message"] and "fleet tenants add" in error["message"]
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-ghost", max_retries=0).completions.create(
            model="smol", prompt="hi", max_tokens=1)
    error = _refused(_post(gateway_url, "sk-batchonly"), 403, "lane_not_allowed")
    assert "'default' lane" in error["message"]
    r = redis.Redis.from_url(fleet_redis.url)
    assert not any(r.xlen(keys.stream_key(ns, t, lane)) for ns in ("idle", "default")
                   for t in ("ghost", "batchonly") for lane in keys.LANES)


def test_a_tenant_added_is_served_and_one_removed_refused_within_seconds(gateway_url,
                                                                         fleet_redis, capsys):
    r = redis.Redis.from_url(fleet_redis.url)
    stream = keys.stream_key("idle", "ghost", "default")
    for _ in range(QUEUE_BOUND):  # once admitted, ghost's full queue answers 503
        r.xadd(stream, {keys.STREAM_FIELD: b"{}"})
    try:
        register_tenants(fleet_redis.url, "ghost")
        wait_until(lambda: _post(gateway_url, "sk-ghost").status_code == 503, timeout=15,
                   interval=0.5, what="the new tenant admitted (to its full queue)")
        assert main(["tenants", "remove", "ghost", "--redis-url", fleet_redis.url]) == 0
        wait_until(lambda: _post(gateway_url, "sk-ghost").status_code == 403, timeout=15,
                   interval=0.5, what="the removed tenant refused")
    finally:
        r.hdel(keys.tenants_key(), "ghost")
        r.delete(stream)


def test_ready_counts_the_queues_of_the_served_tenants(gateway_url, fleet_redis):
    r = redis.Redis.from_url(fleet_redis.url)
    streams = [keys.stream_key("idle", "globex", "default"),
               keys.stream_key("idle", "limited", "default"),
               keys.stream_key("idle", "batchonly", "batch")]  # not on the gateway's lane
    for stream in streams:
        r.xadd(stream, {keys.STREAM_FIELD: b"{}"})
    try:
        reply = httpx.get(gateway_url + "/ready", timeout=30)
        assert reply.status_code == 200 and reply.json()["queued"]["idle"] == 2
    finally:
        r.delete(*streams)


# -- on a Redis Cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = RedisCluster().start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cluster_gateway(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster-gateway")
    register_tenants(cluster.nodes[-1].url, "acme", "globex")  # through a replica's URL
    (tmp / "keys.json").write_text(json.dumps({"keys": {"sk-a": "acme", "sk-g": "globex",
                                                        "sk-x": "ghost"}}))
    gateway = start_gateway(cluster.nodes[1].url, tmp / "gateway.log", free_port(),
                            "--served-model", "idle", "--served-model", "tiny=default",
                            "--api-keys", str(tmp / "keys.json"), "--max-queue", "2",
                            "--retry-after", "1")
    yield gateway
    gateway.stop()


def test_on_a_cluster_ready_bounds_and_refusals(cluster, cluster_gateway):
    url = cluster_gateway.url
    reply = httpx.get(url + "/ready", timeout=30)
    assert reply.status_code == 200, cluster_gateway.output()[-2000:]
    assert reply.json()["queued"] == {"idle": 0, "tiny": 0}
    acme = keys.stream_key("idle", "acme", "default")
    with cluster.client() as client:
        for _ in range(2):
            client.xadd(acme, {keys.STREAM_FIELD: b"{}"})
        try:
            _refused(_post(url, "sk-a"), 503, "overloaded")  # acme's bound, in acme's slot
            assert client.xlen(acme) == 2
            _refused(_post(url, "sk-x"), 403, "tenant_not_registered")
            assert httpx.get(url + "/ready", timeout=30).json()["queued"]["idle"] == 2
        finally:
            client.delete(acme)
    assert "Traceback" not in cluster_gateway.output()


def test_on_a_cluster_each_tenant_enqueues_into_its_own_stream(cluster, cluster_gateway):
    # Needs the cluster-aware client of issue 16 (sharded subscriptions).
    acme, globex = (keys.stream_key("idle", t, "default") for t in ("acme", "globex"))
    with cluster.client() as client:
        try:
            _admitted(cluster_gateway.url, "sk-a")
            _admitted(cluster_gateway.url, "sk-g")
            assert (client.xlen(acme), client.xlen(globex)) == (1, 1)
        finally:
            client.delete(acme, globex)


def test_on_a_cluster_a_worker_answers_through_the_gateway(cluster, cluster_gateway, tmp_path,
                                                           tiny_model):
    # Needs the worker and client of the per-tenant, cluster-aware edge (issue 16).
    workers = WorkerFactory(types.SimpleNamespace(url=cluster.url), tiny_model, tmp_path)
    worker = workers.start(wait=False)
    client = cluster.client()
    try:
        wait_until(lambda: client.exists(keys.worker_key("default", worker.worker_id))
                   or worker.proc.poll() is not None, timeout=120, what="the worker")
        assert worker.proc.poll() is None, worker.output()[-3000:]
        body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 4, "temperature": 0,
                "ignore_eos": True}
        for key in ("sk-a", "sk-g"):
            reply = _post(cluster_gateway.url, key, body, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 4
        with httpx.stream("POST", cluster_gateway.url + "/v1/completions", timeout=60,
                          json={**body, "stream": True},
                          headers={"Authorization": "Bearer sk-g"}) as stream:
            assert stream.status_code == 200
            assert stream.read().endswith(b"data: [DONE]\n\n")
    finally:
        client.close()
        workers.cleanup()


def test_on_a_cluster_ready_as_the_shipped_gateway_user(cluster, tmp_path):
    # Needs ops/redis/users.acl's fleet-gateway user to hold the cluster commands and the
    # registry read (issue 16). ACLs are per node: the user is set on every node.
    passwords = render_acl(tmp_path / "users.acl")
    line = next(x for x in (tmp_path / "users.acl").read_text().splitlines()
                if x.startswith("user fleet-gateway "))
    name, rules = setuser_args(line)
    for node in cluster.nodes:
        redis.Redis(port=node.port).execute_command("ACL", "SETUSER", name, *rules)
    user_url = cluster.nodes[2].url.replace(
        "redis://", f"redis://fleet-gateway:{passwords['fleet-gateway']}@")
    gateway = start_gateway(user_url, tmp_path / "gateway.log", free_port(), "--served-model",
                            "tiny=default")
    try:
        reply = httpx.get(gateway.url + "/ready", timeout=30)
        assert reply.status_code == 200, gateway.output()[-2000:]
        assert reply.json()["queued"] == {"tiny": 0}
        assert "NOPERM" not in gateway.output()
    finally:
        gateway.stop()

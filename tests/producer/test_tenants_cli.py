"""``fleet tenants`` as an operator uses it, against a real redis-server (and a real
3-master cluster): the registry it writes is what workers decode, and the ACL user it
applies confines the tenant to its own streams -- on every node of a cluster."""
from __future__ import annotations

import hashlib
import json

import pytest
import redis

from producer.cli import main
from shared import keys, tenants
from shared.tenants import TenantConfig
from tests.redis_cluster import RedisCluster


def fleet(capsys, url: str, *args: str) -> tuple[int, str, str]:
    code = main(["tenants", *args, "--redis-url", url])
    out = capsys.readouterr()
    return code, out.out, out.err


def registry(client) -> dict[str, TenantConfig]:
    found, bad = tenants.parse_registry(client.hgetall(keys.tenants_key()))
    assert not bad
    return found


def test_add_list_remove(redis_server, r, capsys):
    url = redis_server.url
    code, out, _ = fleet(capsys, url, "list")
    assert code == 0 and "implicit tenant 'default'" in out
    code, out, err = fleet(capsys, url, "add", "acme", "--lanes", "high,default", "--weight",
                           "2", "--max-running", "4")
    assert code == 0 and out.startswith("added tenant acme")
    assert "now it serves registered tenants only" in err  # the implicit default is gone
    assert registry(r)["acme"] == TenantConfig(name="acme", lanes=["high", "default"],
                                               weight=2.0, max_running=4)
    code, out, err = fleet(capsys, url, "add", "acme", "--lanes", "default")
    assert out.startswith("updated tenant acme") and err == ""
    assert registry(r)["acme"].lanes == ["default"] and registry(r)["acme"].max_running is None
    fleet(capsys, url, "add", "globex")
    code, out, _ = fleet(capsys, url, "list", "--json")
    listed = json.loads(out)
    assert [t["name"] for t in listed["tenants"]] == ["acme", "globex"]
    assert listed["tenants"][1]["lanes"] == ["default", "batch"] and not listed["implicit_default"]
    code, out, _ = fleet(capsys, url, "list")
    assert "acme" in out and "globex" in out and "default,batch" in out

    r.xadd(keys.stream_key("default", "acme", "default"), {keys.STREAM_FIELD: b"{}"})
    code, out, err = fleet(capsys, url, "remove", "acme")
    assert code == 0 and out == "removed tenant acme\n"
    assert "1 entries remain in fleet:default:requests:{acme}:default" in err
    assert "tenant-acme" in err and "ACL DELUSER" in err
    assert set(registry(r)) == {"globex"}
    assert r.xlen(keys.stream_key("default", "acme", "default")) == 1  # left for the operator
    assert fleet(capsys, url, "remove", "acme")[0] == 1
    code, _, err = fleet(capsys, url, "remove", "globex")
    assert "registry is now empty" in err


@pytest.mark.parametrize("args", [["bad{name}"], ["acme", "--lanes", "urgent"],
                                  ["acme", "--lanes", "default,default"],
                                  ["acme", "--weight", "0"], ["acme", "--max-running", "0"]])
def test_add_refuses_what_workers_would_ignore(redis_server, r, capsys, args):
    code, _, err = fleet(capsys, redis_server.url, "add", *args)
    assert code == 2 and err.startswith("invalid tenant")
    assert r.hlen(keys.tenants_key()) == 0


def _as(server_url: str, user: str, password: str) -> redis.Redis:
    return redis.Redis.from_url(server_url.replace("redis://", f"redis://{user}:{password}@"))


def test_applied_acl_confines_the_tenant_to_its_own_streams(redis_server, r, capsys,
                                                             monkeypatch):
    url = redis_server.url
    fleet(capsys, url, "add", "acme", "--lanes", "default,batch")
    fleet(capsys, url, "add", "globex")
    monkeypatch.setenv("ACME_PASSWORD", "first-secret")
    code, out, err = fleet(capsys, url, "acl", "acme", "--password-env", "ACME_PASSWORD",
                           "--apply")
    assert code == 0 and "applied on the server" in err and "ACL SAVE" in err
    digest = hashlib.sha256(b"first-secret").hexdigest()
    assert out.strip() == tenants.acl_user(registry(r)["acme"], digest)  # an aclfile line

    acme = _as(url, "tenant-acme", "first-secret")
    own = keys.stream_key("default", "acme", "default")
    assert acme.xadd(own, {keys.STREAM_FIELD: b"{}"})
    assert acme.hget(keys.state_key("acme", "r1"), "result") is None
    for stream in (keys.stream_key("default", "acme", "high"),  # a lane it was not given
                   keys.stream_key("default", "globex", "default"),  # another tenant's
                   keys.legacy_stream_key("default", "default")):  # the old shared one
        with pytest.raises(redis.exceptions.NoPermissionError):
            acme.xadd(stream, {keys.STREAM_FIELD: b"{}"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        acme.xtrim(own, maxlen=0)
    with pytest.raises(redis.exceptions.NoPermissionError):
        acme.hget(keys.state_key("globex", "r1"), "result")

    monkeypatch.setenv("ACME_PASSWORD", "second-secret")  # rotating: the old one stops working
    assert fleet(capsys, url, "acl", "acme", "--password-env", "ACME_PASSWORD", "--apply")[0] == 0
    with pytest.raises(redis.exceptions.AuthenticationError):
        _as(url, "tenant-acme", "first-secret").ping()
    assert _as(url, "tenant-acme", "second-secret").xlen(own) == 1


def test_acl_needs_a_registered_tenant_and_a_real_hash(redis_server, capsys):
    url = redis_server.url
    code, _, err = fleet(capsys, url, "acl", "acme", "--password-sha256", "ab" * 32)
    assert code == 1 and "is registered (fleet tenants add acme)" in err
    code, out, _ = fleet(capsys, url, "acl", "default", "--password-sha256", "AB" * 32,
                         "--model", "smol")  # the implicit tenant of an empty registry
    assert code == 0 and "~fleet:smol:requests:{default}:high" in out and "ab" * 32 in out
    assert fleet(capsys, url, "acl", "default", "--password-sha256", "xyz")[0] == 2
    assert fleet(capsys, url, "acl", "default", "--password-env", "FLEET_NO_SUCH_VAR")[0] == 2


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster().start()
    yield c
    c.stop()


def test_on_a_cluster_the_acl_reaches_every_master_and_replica(cluster, capsys):
    replica_url = cluster.nodes[-1].url  # any node will do, a replica too
    assert fleet(capsys, replica_url, "add", "acme", "--lanes", "default")[0] == 0
    code, out, err = fleet(capsys, replica_url, "acl", "acme", "--password-sha256",
                           hashlib.sha256(b"pw").hexdigest(), "--apply")
    assert code == 0, err
    assert err.count("applied on") == len(cluster.nodes) == 6
    # Each node is named once with its role. Three masters and three replicas, unless a
    # node timeout on a loaded machine promoted a replica while its master still answers.
    assert err.count("(master)") + err.count("(replica)") == 6 and err.count("(master)") >= 3
    for node in cluster.nodes:
        assert redis.Redis(port=node.port).acl_getuser("tenant-acme")["enabled"]
    with cluster.client() as admin:
        assert set(registry(admin)) == {"acme"}
    tenant = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port,
                                username="tenant-acme", password="pw")
    try:
        assert tenant.xadd(keys.stream_key("default", "acme", "default"), {keys.STREAM_FIELD: b"{}"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            tenant.xadd(keys.stream_key("default", "acme", "high"), {keys.STREAM_FIELD: b"{}"})
    finally:
        tenant.close()

"""ops/redis/users.acl on a real redis-server: every role works, a tenant sees only its own.

The worker runs as ``fleet-worker``, the client as ``tenant-acme``; then ``tenant-acme``
tries to read, subscribe to and forge ``tenant-globex``'s keys and channel, and to touch
the queue beyond enqueuing.
"""
from __future__ import annotations

import pytest
import redis
from ops_harness import AclRedisServer, _client, _denied, make_tls_cert, render_acl
from redis.exceptions import NoPermissionError
from redis_server import REPO

from producer import FleetClient
from producer.exporter import QueueCollector
from shared import keys

STREAM = keys.stream_key("default", "default", "default")


def test_roles_work_and_a_tenant_reaches_only_its_own(acl_server, acl_workers):
    worker = acl_workers.start()  # as fleet-worker: intake, scripts, heartbeat, pub/sub
    assert acl_server.url.startswith("rediss://" if acl_server.cert else "redis://")
    with FleetClient(acl_server.url_for("tenant-globex"), tenant="globex") as globex:
        theirs = globex.generate(request_id="secret", prompt_token_ids=[1, 2, 3], max_tokens=6,
                                 temperature=0.0, ignore_eos=True, timeout=60)
    with FleetClient(acl_server.url_for("tenant-acme"), tenant="acme") as acme:
        stream = acme.submit(request_id="mine", prompt_token_ids=[1, 5, 6], max_tokens=8,
                             temperature=0.0, ignore_eos=True)
        tokens = [i for t in stream for i in t.token_ids]
        result = stream.result(timeout=60)
        assert tokens == result.token_ids and len(tokens) == 8
        assert acme.get_result("mine").token_ids == tokens  # stored result, read back
        assert len(acme.get_progress("mine")) >= 1
    assert "NOPERM" not in worker.output() and "permission" not in worker.output()

    acme = _client(acl_server, "tenant-acme")
    other = dict(tenant="globex", request_id="secret")
    # cannot read another tenant's result, progress, or listen on its channel
    _denied(lambda: acme.hget(keys.state_key(**other), "result"))
    _denied(lambda: acme.lrange(keys.progress_key(**other), 0, -1))
    pubsub = acme.pubsub()
    pubsub.subscribe(keys.channel(**other))  # the refusal comes as the reply
    _denied(lambda: pubsub.get_message(timeout=2))
    # cannot forge events or results into another tenant's channel and keys (nor its own)
    _denied(lambda: acme.publish(keys.channel(**other), b'{"type":"result"}'))
    _denied(lambda: acme.publish(keys.channel("acme", "mine"), b'{"type":"result"}'))
    _denied(lambda: acme.rpush(keys.progress_key(**other), b"{}"))
    _denied(lambda: acme.hset(keys.state_key(**other), "result", b"{}"))
    _denied(lambda: acme.hset(keys.state_key("acme", "mine"), "result", b"{}"))
    _denied(lambda: acme.set(keys.cancel_key(**other), b"1"))
    # cannot read, take, acknowledge or destroy queued work; cannot see workers
    _denied(lambda: acme.xrange(STREAM))
    _denied(lambda: acme.xreadgroup(keys.GROUP, "thief", {STREAM: ">"}))
    _denied(lambda: acme.xack(STREAM, keys.GROUP, "0-1"))
    _denied(lambda: acme.delete(STREAM))
    _denied(lambda: acme.set(STREAM, b"x"))
    _denied(lambda: acme.keys("*"))
    _denied(lambda: acme.hgetall(keys.worker_key("default", worker.worker_id)))
    # its own cancel key is writable (how a tenant cancels)
    assert acme.set(keys.cancel_key("acme", "later"), b"1", ex=60)
    assert theirs.token_ids and len(theirs.token_ids) == 6


def test_redis_conf_never_evicts_and_persists_every_second(tmp_path):
    cert = make_tls_cert(tmp_path)
    if cert is None:
        pytest.skip("openssl not installed: ops/redis/redis.conf is TLS-only")
    acl = tmp_path / "users.acl"
    conf = tmp_path / "redis.conf"  # as mounted in ops/k8s/redis.yaml, but in tmp_path
    (tmp_path / "data").mkdir()
    conf.write_text((REPO / "ops" / "redis" / "redis.conf").read_text()
                    .replace("dir /data", f"dir {tmp_path / 'data'}"))
    server = AclRedisServer(acl, render_acl(acl), cert, conf=conf).start()
    try:
        admin = _client(server, "fleet-admin")
        config = {k: admin.config_get(k)[k] for k in
                  ("maxmemory-policy", "appendonly", "appendfsync", "port", "aclfile")}
        assert config == {"maxmemory-policy": "noeviction", "appendonly": "yes",
                          "appendfsync": "everysec", "port": "0", "aclfile": str(acl)}
        assert admin.acl_whoami() == "fleet-admin"
        # One hostile XADD cannot carry more than 8 MiB in a field (workers read every entry).
        with pytest.raises(redis.RedisError) as refused:
            admin.xadd(STREAM, {keys.STREAM_FIELD: b"x" * (9 << 20)})
        assert not isinstance(refused.value, NoPermissionError)
        assert admin.xlen(STREAM) == 0
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url_for("fleet-admin").replace(
                server.passwords["fleet-admin"], "wrong")).ping()
    finally:
        server.stop()


def test_exporter_and_keda_users_read_the_queue(acl_server):
    admin = _client(acl_server, "fleet-admin")
    admin.xadd(STREAM, {keys.STREAM_FIELD: b"{}"})
    collector = QueueCollector(acl_server.url_for("fleet-exporter"), ["default"])
    families = {f.name: f for f in collector.collect()}
    assert families["fleet:queue_up"].samples[0].value == 1
    backlog = families["fleet:queue_backlog"].samples[0].value
    assert backlog == 1  # the exporter created the group from 0: the entry is lag
    keda = _client(acl_server, "fleet-keda")
    assert keda.xinfo_groups(STREAM)[0]["lag"] == 1
    assert keda.xpending(STREAM, keys.GROUP)["pending"] == 0
    _denied(lambda: keda.xrange(STREAM))  # counts, never prompts
    exporter = _client(acl_server, "fleet-exporter")
    _denied(lambda: exporter.xrange(STREAM))
    _denied(lambda: exporter.hget(keys.state_key("acme", "x"), "result"))


def test_producer_user_enqueues_for_any_tenant_but_cannot_forge(acl_server):
    producer = _client(acl_server, "fleet-producer")
    assert producer.xadd(STREAM, {keys.STREAM_FIELD: b"{}"})
    assert producer.publish(keys.control_channel("default"), b"{}") == 0
    assert producer.hget(keys.state_key("acme", "x"), "result") is None
    _denied(lambda: producer.publish(keys.channel("acme", "x"), b"{}"))
    _denied(lambda: producer.hset(keys.state_key("acme", "x"), "result", b"{}"))
    _denied(lambda: producer.xreadgroup(keys.GROUP, "thief", {STREAM: ">"}))

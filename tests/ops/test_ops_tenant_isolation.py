"""The attacks of issue 16, as tenant-acme with the shipped ACL, against a real worker:
each is refused, or harms only acme's own streams; globex is served throughout."""
from __future__ import annotations

import json

import pytest
import redis
from redis_server import wait_until
from ops_harness import _client, _denied

from producer import FleetClient
from shared import keys

ACME_DEFAULT = keys.stream_key("default", "acme", "default")
GLOBEX_DEFAULT = keys.stream_key("default", "globex", "default")
GLOBEX_HIGH = keys.stream_key("default", "globex", "high")
MAX_ID = "18446744073709551615-18446744073709551615"


def _request(request_id: str, **fields) -> bytes:
    return json.dumps({"request_id": request_id, "prompt_token_ids": [1, 2, 3],
                       "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                       **fields}).encode()


def _globex_generates(server, request_id: str) -> list[int]:
    with FleetClient(server.url_for("tenant-globex"), tenant="globex") as globex:
        return globex.generate(request_id=request_id, prompt_token_ids=[1, 2, 3], max_tokens=4,
                               temperature=0.0, ignore_eos=True, timeout=60).token_ids


def test_a_tenant_can_trim_and_block_only_its_own_stream(acl_server, acl_workers):
    admin = _client(acl_server, "fleet-admin")
    acme = _client(acl_server, "tenant-acme")
    for i in range(17):  # globex's backlog, queued while no worker runs
        admin.xadd(GLOBEX_DEFAULT, {keys.STREAM_FIELD: _request(f"queued-{i}")})
    _denied(lambda: acme.xadd(GLOBEX_DEFAULT, {keys.STREAM_FIELD: b"{}"}, maxlen=0,
                              approximate=False))
    _denied(lambda: acme.xadd(GLOBEX_DEFAULT, {keys.STREAM_FIELD: b"{}"}, id=MAX_ID))
    _denied(lambda: acme.xadd(keys.legacy_stream_key("default", "default"),
                              {keys.STREAM_FIELD: b"{}"}))
    assert admin.xlen(GLOBEX_DEFAULT) == 17
    # acme may wreck its own stream: trim it, and block it with the largest id
    acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("a1")}, maxlen=0, approximate=False)
    acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("a2")}, id=MAX_ID)
    with pytest.raises(redis.ResponseError):
        acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("a3")})
    worker = acl_workers.start()
    wait_until(lambda: all(admin.hget(keys.state_key("globex", f"queued-{i}"), "result")
                           for i in range(17)), timeout=120, what="globex's backlog served")
    assert len(_globex_generates(acl_server, "after")) == 4
    # deleting acme's broken stream to repair it stops nothing
    admin.delete(ACME_DEFAULT)
    assert len(_globex_generates(acl_server, "after-delete")) == 4
    wait_until(lambda: admin.exists(ACME_DEFAULT), what="acme's group recreated")
    acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("a4")})
    wait_until(lambda: admin.hget(keys.state_key("acme", "a4"), "result"), timeout=60,
               what="acme served again")
    assert worker.proc.poll() is None


def test_a_tenant_uses_only_its_lanes(acl_server, acl_workers):
    """globex (a batch tenant) may not enqueue into high; even an entry an operator put
    there is not read, since the registry does not give globex that lane."""
    globex = _client(acl_server, "tenant-globex")
    _denied(lambda: globex.xadd(GLOBEX_HIGH, {keys.STREAM_FIELD: _request("jump")}))
    admin = _client(acl_server, "fleet-admin")
    admin.xadd(GLOBEX_HIGH, {keys.STREAM_FIELD: _request("jump")})
    acl_workers.start()
    assert len(_globex_generates(acl_server, "normal")) == 4
    assert admin.hget(keys.state_key("globex", "jump"), "result") is None
    assert admin.xlen(GLOBEX_HIGH) == 1  # left in place, undelivered


def test_a_tenant_cannot_answer_for_another(acl_server, acl_workers):
    """acme enqueues a request naming globex and the id globex will use: acme gets a typed
    failure on its own keys; globex's real request later gets its own answer."""
    acl_workers.start()
    acme = _client(acl_server, "tenant-acme")
    acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("squat", tenant="globex",
                                                         prompt_token_ids=[9, 9])})
    admin = _client(acl_server, "fleet-admin")
    stored = wait_until(lambda: admin.hget(keys.state_key("acme", "squat"), "result"),
                        what="acme's failure stored")
    failure = json.loads(stored)
    assert failure["type"] == "failure" and failure["code"] == "tenant_mismatch"
    assert admin.hget(keys.state_key("globex", "squat"), "result") is None
    with FleetClient(acl_server.url_for("tenant-globex"), tenant="globex") as globex:
        mine = globex.generate(request_id="squat", prompt_token_ids=[1, 2, 3], max_tokens=4,
                               temperature=0.0, ignore_eos=True, timeout=60)
        reference = globex.generate(request_id="reference", prompt_token_ids=[1, 2, 3],
                                    max_tokens=4, temperature=0.0, ignore_eos=True, timeout=60)
    assert mine.token_ids == reference.token_ids
    # leaving the tenant out is fine: the stream names it
    acme.xadd(ACME_DEFAULT, {keys.STREAM_FIELD: _request("no-tenant")})
    stored = wait_until(lambda: admin.hget(keys.state_key("acme", "no-tenant"), "result"),
                        what="served as acme")
    assert json.loads(stored)["type"] == "result"

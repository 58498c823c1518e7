"""An upgrade loses nothing: requests left in the old shared streams (before per-tenant
streams) are served by a new worker, queued ones and ones an old worker held when it died,
in the tenant their payload names; the new worker creates no old stream of its own."""
from __future__ import annotations

import json

from redis_server import wait_until

from shared import keys

OLD = keys.legacy_stream_key("default", "default")


def _request(request_id: str, tenant: str) -> bytes:
    return json.dumps({"request_id": request_id, "tenant": tenant, "prompt_token_ids": [1, 2],
                       "max_tokens": 3, "temperature": 0, "ignore_eos": True}).encode()


def test_old_shared_streams_are_drained(workers, r):
    r.xgroup_create(OLD, keys.GROUP, id="0", mkstream=True)
    r.xadd(OLD, {keys.STREAM_FIELD: _request("held", "globex")})
    r.xreadgroup(keys.GROUP, "old-worker", {OLD: ">"}, count=1)  # held by a worker now gone
    r.xadd(OLD, {keys.STREAM_FIELD: _request("queued", "acme")})
    workers.start()
    wait_until(lambda: r.hget(keys.state_key("acme", "queued"), "result"), timeout=60,
               what="the queued old entry served")
    wait_until(lambda: r.hget(keys.state_key("globex", "held"), "result"), timeout=60,
               what="the old worker's entry reclaimed and served")
    assert json.loads(r.hget(keys.state_key("globex", "held"), "result"))["type"] == "result"
    wait_until(lambda: r.xlen(OLD) == 0, what="acknowledged")
    assert not r.exists(keys.legacy_stream_key("default", "high"))

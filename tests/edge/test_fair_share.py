"""Fair share on a real worker: tenant A floods a lane with 200 long requests, then tenant
B submits 5. B's requests start within a bounded number of engine steps, not after A's
backlog.

The bound, in engine steps after B submits: 3 x A's request length (64). The worker runs 4
sequences at a time (A's first 4) and holds 4 more read-but-waiting, all A's. The first
places to free go to B (it holds nothing, A everything), so B's requests enter behind at
most those 4 waiting ones: within about two lengths of A's requests. Served first come,
first served, B would wait for A's 200: 50 x 64 = 3,200 steps. Steps are counted by A's
tokens: every step gives each running request one token, so steps >= A's new tokens / 4.
"""
from __future__ import annotations

import json

import redis
from redis_server import wait_until

from shared import keys, tenants
from shared.tenants import TenantConfig

A_LENGTH, RUNNING = 64, 4
BOUND_STEPS = 3 * A_LENGTH


def _published(r: redis.Redis, tenant: str, ids: list[str]) -> list[int]:
    pipe = r.pipeline(transaction=False)
    for request_id in ids:
        pipe.hget(keys.state_key(tenant, request_id), "published")
    return [int(x or 0) for x in pipe.execute()]


def test_a_flood_does_not_starve_another_tenant(workers, r):
    r.hset(keys.tenants_key(), mapping={
        t: tenants.encode(TenantConfig(name=t, lanes=["default"])) for t in ("a", "b")})
    workers.start(max_num_seqs=RUNNING, local_queue=4)
    a_ids = [f"a-{i}" for i in range(200)]
    pipe = r.pipeline(transaction=False)
    for request_id in a_ids:
        pipe.xadd(keys.stream_key("default", "a", "default"), {keys.STREAM_FIELD: json.dumps({
            "request_id": request_id, "prompt_token_ids": [1, 2, 3, 4], "max_tokens": A_LENGTH,
            "temperature": 0, "ignore_eos": True, "speculative": False})})
    pipe.execute()
    wait_until(lambda: sum(_published(r, "a", a_ids)) >= 8, what="A being served")
    a_before = sum(_published(r, "a", a_ids))
    b_ids = [f"b-{i}" for i in range(5)]
    for request_id in b_ids:
        r.xadd(keys.stream_key("default", "b", "default"), {keys.STREAM_FIELD: json.dumps({
            "request_id": request_id, "prompt_token_ids": [5, 6], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True})})
    wait_until(lambda: all(n > 0 for n in _published(r, "b", b_ids)), timeout=120,
               interval=0.01, what="all of B's requests started")
    steps = (sum(_published(r, "a", a_ids)) - a_before) / RUNNING
    assert steps <= BOUND_STEPS, f"B started after about {steps:.0f} engine steps"
    done_a = sum(1 for n in _published(r, "a", a_ids) if n >= A_LENGTH)
    assert done_a < 40, "A's backlog was served first"

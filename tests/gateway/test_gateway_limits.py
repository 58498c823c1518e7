"""The gateway accepts exactly what the fleet accepts: a body or a fleet request over
``MAX_PAYLOAD_BYTES`` is a 413 at once -- nothing enqueued, no quota slot taken -- instead of
an entry the worker dead-letters unread while the caller waits out its deadline."""
from __future__ import annotations

import json
import time

import httpx
import redis

from shared import keys
from shared import limits as L

HEADERS = {"Authorization": "Bearer sk-single", "Content-Type": "application/json"}


def _chat(*contents: str, model: str = "idle") -> bytes:
    body = {"model": model, "max_tokens": 1,
            "messages": [{"role": "user", "content": c} for c in contents]}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _inflight(fleet_redis, tenant: str) -> int:
    r = redis.Redis.from_url(fleet_redis.url)
    return r.zcard(f"{keys.PREFIX}:gateway:{{{tenant}}}:inflight")


def _post(gateway_url: str, body: bytes) -> httpx.Response:
    return httpx.post(gateway_url + "/v1/chat/completions", content=body, headers=HEADERS,
                      timeout=30)


def _assert_413(reply: httpx.Response) -> dict:
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_too_large" and str(L.MAX_PAYLOAD_BYTES) in error["message"]
    return error


def test_body_over_the_fleet_limit_is_413_at_once(gateway_url, fleet_redis):
    # 576 KB, valid in every field (two messages of 96k chars): under the 1 MiB the gateway
    # used to read, over the fleet's 512 KiB. It was enqueued, and the worker dead-lettered
    # it unread (no id to answer), so the call waited out its 630 s holding the one slot.
    body = _chat("€" * 96_000, "€" * 96_000)
    assert L.MAX_PAYLOAD_BYTES < len(body) < 1024 * 1024
    stream = keys.stream_key("idle", "single", "default")
    before = redis.Redis.from_url(fleet_redis.url).xlen(stream)
    started = time.monotonic()
    _assert_413(_post(gateway_url, body))
    assert time.monotonic() - started < 10
    assert redis.Redis.from_url(fleet_redis.url).xlen(stream) == before  # nothing enqueued
    assert _inflight(fleet_redis, "single") == 0  # and no slot of the tenant's one held


def test_fleet_request_over_the_limit_is_413_though_the_body_fits(gateway_url, fleet_redis):
    # The fleet request carries more than the body (defaults, deadline, ids), so a body just
    # under the limit becomes a payload just over it. Two messages: each is at most 100k chars.
    first = "€" * 87_000
    room = L.MAX_PAYLOAD_BYTES - 16 - len(_chat(first, ""))
    body = _chat(first, "€" * (room // 3) + "a" * (room % 3))
    assert len(body) == L.MAX_PAYLOAD_BYTES - 16
    error = _assert_413(_post(gateway_url, body))
    assert "as a fleet request" in error["message"]
    assert _inflight(fleet_redis, "single") == 0


def test_the_slot_is_free_after_a_413(gateway_url):
    _assert_413(_post(gateway_url, _chat("x" * (L.MAX_PAYLOAD_BYTES + 1), model="smol")))
    reply = _post(gateway_url, _chat("Hi", model="smol"))  # the tenant's one slot is free
    assert reply.status_code == 200, reply.text

"""Disconnects cancel; an overfull queue answers 503 and a spent quota 429, with Retry-After."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import redis
from conftest import QUEUE_BOUND
from redis_server import wait_until

from producer.status import collect
from shared import codec, keys

CHAT = [{"role": "user", "content": "Tell me a long story about a dragon."}]
LONG = {"extra_body": {"ignore_eos": True}, "max_tokens": 1000, "temperature": 0}


def _worker_status(url: str) -> dict:
    (status,) = asyncio.run(collect(url, "default"))["workers"].values()
    return status


def _client(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_disconnect_mid_stream_cancels_and_frees_blocks(openai_client, fleet_redis):
    stream = openai_client.chat.completions.create(model="smol", messages=CHAT, stream=True, **LONG)
    chunks = iter(stream)
    request_id = next(chunks).id
    for _ in range(5):
        next(chunks)
    wait_until(lambda: float(_worker_status(fleet_redis.url)["kv_usage"]) > 0, what="KV in use")
    stream.close()  # the client goes away mid-answer

    r = redis.Redis.from_url(fleet_redis.url)
    raw = wait_until(lambda: r.hget(keys.state_key("acme", request_id), "result"), timeout=30,
                     what="the durable result")
    result = codec.decode_terminal(raw)
    assert result.finish_reason == "cancelled"
    assert 5 <= result.usage.completion_tokens < 1000
    wait_until(lambda: (s := _worker_status(fleet_redis.url))["running"] == 0
               and float(s["kv_usage"]) == 0.0, what="the worker's blocks freed")


def test_overfull_queue_answers_503_with_retry_after_for_that_tenant_only(gateway_url,
                                                                          fleet_redis):
    r = redis.Redis.from_url(fleet_redis.url)
    acme, globex = (keys.stream_key("idle", t, "default") for t in ("acme", "globex"))
    for _ in range(QUEUE_BOUND):  # acme's own queue of "idle" (no worker serves it) is full
        r.xadd(acme, {keys.STREAM_FIELD: b"{}"})
    try:
        reply = httpx.post(gateway_url + "/v1/completions", json={"model": "idle", "prompt": "hi"},
                           headers={"Authorization": "Bearer sk-acme"})
        assert reply.status_code == 503 and reply.headers["Retry-After"] == "7"
        error = reply.json()["error"]
        assert error["code"] == "overloaded" and "tenant 'acme'" in error["message"]
        assert f"{QUEUE_BOUND} requests are waiting" in error["message"]
        with pytest.raises(openai.InternalServerError) as exc:
            _client(gateway_url, "sk-acme").completions.create(model="idle", prompt="hi")
        assert exc.value.status_code == 503
        assert r.xlen(acme) == QUEUE_BOUND  # nothing more enqueued
        # another tenant's queue is its own: globex is admitted, into its own stream
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gateway_url + "/v1/completions", json={"model": "idle", "prompt": "hi"},
                       headers={"Authorization": "Bearer sk-globex"}, timeout=3)
        assert r.xlen(globex) == 1
    finally:
        r.delete(acme, globex)


def test_spent_rate_quota_answers_429_with_retry_after(gateway_url):
    if time.time() % 60 > 50:  # keep the three calls inside one quota minute
        time.sleep(61 - time.time() % 60)
    client = _client(gateway_url, "sk-limited")
    for _ in range(2):
        client.completions.create(model="smol", prompt="Hi", max_tokens=1)
    reply = httpx.post(gateway_url + "/v1/completions", json={"model": "smol", "prompt": "Hi"},
                       headers={"Authorization": "Bearer sk-limited"})
    assert reply.status_code == 429 and reply.json()["error"]["type"] == "rate_limit_exceeded"
    assert 1 <= int(reply.headers["Retry-After"]) <= 60
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="smol", prompt="Hi", max_tokens=1)


def test_concurrency_quota_429_until_the_stream_ends(gateway_url):
    client = _client(gateway_url, "sk-single")
    stream = client.chat.completions.create(model="smol", messages=CHAT, stream=True, **LONG)
    next(iter(stream))
    def short_call() -> httpx.Response:
        return httpx.post(gateway_url + "/v1/chat/completions", timeout=60,
                          headers={"Authorization": "Bearer sk-single"},
                          json={"model": "smol", "messages": CHAT, "max_tokens": 1})

    reply = short_call()
    assert reply.status_code == 429 and reply.headers["Retry-After"] == "7"
    assert "in flight" in reply.json()["error"]["message"]
    stream.close()  # disconnect: cancelled, and the slot comes back
    wait_until(lambda: short_call().status_code == 200, timeout=30, interval=0.3,
               what="the slot released")


def test_unknown_or_missing_key_is_401(gateway_url):
    with pytest.raises(openai.AuthenticationError) as exc:
        _client(gateway_url, "sk-wrong").models.list()
    assert exc.value.body["code"] == "invalid_api_key"
    reply = httpx.post(gateway_url + "/v1/completions", json={"model": "smol", "prompt": "x"})
    assert reply.status_code == 401 and reply.json()["error"]["type"] == "invalid_request_error"

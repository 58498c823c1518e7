"""Fuzz: nothing a client sends stops the gateway or gets anything but an OpenAI answer.

A fleet of its own -- redis-server, a worker on the tiny random model, ``fleet gateway`` as
a process -- takes hostile bodies, fields, headers, methods, paths and Content-Length lies
(hypothesis, derandomized: the same examples on every run) while a thread keeps making
valid calls with the official ``openai`` client. Every answer is a success, a 4xx or a 503,
every error OpenAI-shaped; the valid calls keep getting the reference answer; the process
lives; no quota slot is left held.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest
import redis
from fleet_harness import WorkerFactory
from fuzz_strategies import headers, methods, mutated_requests, paths, raw_bodies
from gateway_harness import check_answer, raw_request, register_tenants, start_gateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, free_port, wait_until

from shared import keys

QUEUE_BOUND = 20
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
POSTS = st.sampled_from(["/v1/chat/completions", "/v1/completions"])
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 6, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def fuzz_fleet(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("fuzz")
    server = RedisServer().start()
    register_tenants(server.url, "fuzz", "valid")
    workers = WorkerFactory(server, tiny_model, tmp)
    worker = workers.start(wait=False)
    (tmp / "keys.json").write_text(json.dumps({"keys": {"sk-fuzz": "fuzz", "sk-valid": "valid"},
                                               "quotas": {"fuzz": {"max_concurrent": 4}}}))
    gateway = start_gateway(server.url, tmp / "gateway.log", free_port(), "--served-model",
                            "tiny=default", "--served-model", "idle", "--api-keys",
                            str(tmp / "keys.json"), "--max-queue", str(QUEUE_BOUND),
                            "--retry-after", "1")
    r = redis.Redis.from_url(server.url)
    for _ in range(QUEUE_BOUND):  # no worker serves "idle": a valid request there is a 503
        r.xadd(keys.stream_key("idle", "fuzz", "default"), {keys.STREAM_FIELD: b"{}"})
    workers.wait_ready(worker)
    yield gateway, r
    gateway.stop()
    workers.cleanup()
    server.stop()


class ValidTraffic:
    """Valid calls (chat and completions, whole and streamed) in a thread, each compared
    with the reference answer the same worker gave before any fuzzing."""

    def __init__(self, url: str) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=url + "/v1", api_key="sk-valid", max_retries=3, timeout=60)
        self.reference = {False: self._call(False, False), True: self._call(True, False)}
        self.calls, self.failures = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _call(self, chat: bool, stream: bool) -> str:
        if chat:
            reply = self.client.chat.completions.create(model="tiny", messages=CHAT,
                                                        stream=stream, **GREEDY)
            if stream:
                return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
            return reply.choices[0].message.content
        reply = self.client.completions.create(model="tiny", prompt="Once upon", stream=stream,
                                               **GREEDY)
        return "".join(c.choices[0].text for c in reply) if stream else reply.choices[0].text

    def _run(self) -> None:
        while not self._stop.is_set():
            chat, stream = self.calls % 2 == 0, self.calls % 4 >= 2
            try:
                text = self._call(chat, stream)
                if text != self.reference[chat]:
                    self.failures.append((chat, stream, text, self.reference[chat]))
            except Exception as exc:  # noqa: BLE001 -- reported by check()
                self.failures.append((chat, stream, repr(exc)))
            self.calls += 1

    def __enter__(self) -> "ValidTraffic":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self.failures, self.failures[:3]
        assert self.calls >= 2  # the fuzz really was interleaved with valid calls


@pytest.fixture
def traffic(fuzz_fleet):
    gateway, r = fuzz_fleet
    with ValidTraffic(gateway.url) as valid:
        yield gateway
    assert gateway.proc.poll() is None, gateway.output()[-3000:]
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert "unexpected error" not in gateway.output()  # the 500 guard never fired
    slots = f"{keys.PREFIX}:gateway:{{fuzz}}:inflight"
    wait_until(lambda: r.zcard(slots) == 0, timeout=30, what="every quota slot released")
    assert valid.calls


def _send(url: str, method: str, path: str, hdrs: dict, body: bytes) -> None:
    with httpx.Client(timeout=60) as client:
        reply = client.request(method, url + path, headers=hdrs, content=body)
    check_answer(reply.status_code, reply.headers, reply.content, method)


@settings(FUZZ, max_examples=70)
@given(path=POSTS, hdrs=headers, body=raw_bodies)
def test_hostile_bodies(traffic, path, hdrs, body):
    _send(traffic.url, "POST", path, hdrs, body)


@settings(FUZZ, max_examples=120)
@given(request=mutated_requests(), stream=st.booleans())
def test_hostile_fields(traffic, request, stream):
    path, body = request
    if stream and isinstance(body, dict) and "stream" not in body:
        body["stream"] = True
    _send(traffic.url, "POST", path, {"authorization": b"Bearer sk-fuzz"},
          json.dumps(body).encode())


@settings(FUZZ, max_examples=60)
@given(method=methods, path=paths, hdrs=headers, body=st.binary(max_size=64))
def test_hostile_methods_paths_and_headers(traffic, method, path, hdrs, body):
    _send(traffic.url, method, path, hdrs, body if method not in ("GET", "HEAD") else b"")


@settings(FUZZ, max_examples=30)
@given(path=POSTS, body=raw_bodies.filter(lambda b: len(b) < 20_000),
       lie=st.integers(-40, 40).filter(bool) | st.sampled_from([10**6, 10**12]))
def test_content_length_lies(traffic, path, body, lie):
    declared = max(len(body) + lie, 0)
    head = (f"POST {path} HTTP/1.1\r\nHost: fuzz\r\nAuthorization: Bearer sk-fuzz\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n"
            "Connection: close").encode()
    answer = raw_request(traffic.url, head, body)
    if answer is None:  # it waited for bytes that never came, and saw the client leave
        assert declared > len(body) and declared <= 512 * 1024
        return
    check_answer(*answer)

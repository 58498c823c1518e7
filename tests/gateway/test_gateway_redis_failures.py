"""Redis failing under the gateway -- refused, silent, loading, out of memory, permission
denied -- is a 503 with Retry-After in the OpenAI shape, soon; an unexpected exception is a
500 that shows no traceback or secret. The app runs in-process (Starlette's TestClient)."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import pytest
import redis
from gateway_harness import check_error
from redis_server import RedisServer, free_port
from starlette.testclient import TestClient

from producer.gateway import translate
from producer.gateway.app import create_app
from producer.gateway.options import GatewayOptions

CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
SECRET = "hunter2-very-secret"


@contextlib.contextmanager
def _gateway(redis_url: str):
    options = GatewayOptions(redis_url=redis_url, redis_timeout_s=1.0, retry_after_s=3)
    with TestClient(create_app(options), raise_server_exceptions=False) as client:
        yield client


def _assert_unavailable(client: TestClient) -> None:
    for call in (lambda: client.post("/v1/chat/completions", json=CHAT),
                 lambda: client.get("/ready")):
        started = time.monotonic()
        reply = call()
        assert time.monotonic() - started < 8  # not redis-py's minute of retries
        assert reply.status_code == 503, reply.text
        error = check_error(503, reply.headers, reply.content)
        assert error["code"] == "queue_unavailable" and reply.headers["Retry-After"] == "3"


class _FakeRedis:
    """A TCP server that speaks just enough RESP: every command gets ``reply`` (None: no
    reply ever, a server that hangs)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                # one reply per command: each starts a RESP array line ("*N")
                commands = data.count(b"\r\n*") + data.startswith(b"*")
                if self.reply is not None:
                    conn.sendall(self.reply * commands)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def plain_redis():
    server = RedisServer().start()
    yield server
    server.stop()


def test_refused_connection():
    with _gateway(f"redis://127.0.0.1:{free_port()}/0") as client:
        _assert_unavailable(client)


@pytest.mark.parametrize("reply", [None, b"-LOADING Redis is loading the dataset in memory\r\n"],
                         ids=["silent", "loading"])
def test_silent_or_loading_server(reply):
    fake = _FakeRedis(reply)
    try:
        with _gateway(fake.url) as client:
            _assert_unavailable(client)
    finally:
        fake.close()


def test_out_of_memory(plain_redis):
    redis.Redis.from_url(plain_redis.url).config_set("maxmemory", 1)  # every write is OOM
    with _gateway(plain_redis.url) as client:
        reply = client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 503, reply.text
        check_error(503, reply.headers, reply.content)


def test_permission_denied_and_no_password_in_the_log(plain_redis, caplog):
    admin = redis.Redis.from_url(plain_redis.url)
    admin.acl_setuser("nox", enabled=True, passwords=[f"+{SECRET}"], keys=["*"],
                      channels=["*"], commands=["+@all", "-xadd", "-xlen"])
    caplog.set_level(logging.DEBUG)
    with _gateway(f"redis://nox:{SECRET}@127.0.0.1:{plain_redis.port}/0") as client:
        _assert_unavailable(client)
    assert "NoPermissionError" in caplog.text and "nox:***@" in caplog.text
    assert SECRET not in caplog.text


def test_unexpected_exception_is_a_bare_500(plain_redis, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError(f"boom near redis://gw:{SECRET}@10.0.0.1/0")

    monkeypatch.setattr(translate, "chat_fields", broken)
    with _gateway(plain_redis.url) as client:
        reply = client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 500
        error = check_error(500, reply.headers, reply.content)
        assert error == {"message": "internal error in the gateway", "type": "server_error",
                         "param": None, "code": "internal_error"}
        assert client.get("/health").status_code == 200  # and it keeps serving
    assert "RuntimeError" in caplog.text and "Traceback" in caplog.text
    assert SECRET not in caplog.text and SECRET not in reply.text

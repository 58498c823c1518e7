"""Helpers of the gateway tests: ``fleet gateway`` as a subprocess, raw HTTP over a socket
(for lies httpx refuses to tell), and the one check every answer must pass."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from redis_server import REPO, subprocess_env

ERROR_FIELDS = {"message", "type", "param", "code"}


def register_tenants(redis_url: str, *names: str, lanes: str = "default,batch") -> None:
    """``fleet tenants add NAME`` for each name, as an operator would."""
    from producer.cli import main

    for name in names:
        assert main(["tenants", "add", name, "--lanes", lanes, "--redis-url", redis_url]) == 0


@dataclass
class GatewayProcess:
    url: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:  # keep what it logged; never leave it running
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError("the gateway did not exit within 15 s of SIGTERM; its "
                                     f"log:\n{self.output()[-6000:]}") from None


def start_gateway(redis_url: str, log: Path, port: int, *args: str,
                  log_level: str = "warning") -> GatewayProcess:
    """``fleet gateway`` on ``port``, answering /health before this returns."""
    cmd = [sys.executable, "-m", "producer.cli", "gateway", "--redis-url", redis_url,
           "--port", str(port), "--log-level", log_level, *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(gateway.url + "/health", timeout=1).status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            gateway.stop()
            raise RuntimeError(f"gateway did not start:\n{gateway.output()}")
        time.sleep(0.1)


def check_error(status: int, headers, body: bytes) -> dict:
    """An OpenAI-shaped error: exactly the four fields, typed, no traceback; 503 says when
    to retry. Returns the error object."""
    error = json.loads(body)["error"]
    assert set(error) == ERROR_FIELDS, body[:300]
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    assert error["param"] is None or isinstance(error["param"], str)
    assert b"Traceback" not in body
    if status == 503:
        assert "retry-after" in {k.lower() for k in headers}, headers
    return error


def check_answer(status: int, headers, body: bytes, method: str = "POST") -> None:
    """What any request, however hostile, may get back: a success, a 4xx, or a 503 -- every
    error OpenAI-shaped JSON, every success JSON or a well-formed event stream."""
    assert status == 200 or 400 <= status < 500 or status == 503, (status, body[:300])
    if method == "HEAD":
        return
    content_type = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    if status != 200:
        assert content_type.startswith("application/json"), (status, content_type, body[:200])
        check_error(status, headers, body)
    elif content_type.startswith("text/event-stream"):
        events = [e for e in body.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]", events[-3:]
        for event in events[:-1]:
            obj = json.loads(event.removeprefix("data: "))
            if "error" in obj:
                check_error(400, {}, json.dumps(obj).encode())
    else:
        assert content_type.startswith("application/json"), content_type
        json.loads(body)


def raw_request(url: str, head: bytes, body: bytes, timeout: float = 20.0):
    """Send ``head`` (request line and headers, no blank line) and ``body`` as they are, shut
    the writing side, and parse the first response: (status, headers, body), or None when
    the server closes without answering."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            sock.sendall(head + b"\r\n\r\n" + body)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed while we were still writing
            pass
        data = bytearray()
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    if not data:
        return None
    header_block, _, rest = bytes(data).partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    length = {k.lower(): v for k, v in headers.items()}.get("content-length")
    return status, headers, rest[:int(length)] if length is not None else rest
